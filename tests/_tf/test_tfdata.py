"""Inputs from the TF ecosystem: `files.tfrecord` and `from_tf_dataset`.

Rows load byte-equal to the NumPy arrays the files/pipelines were built
from, through the chunked upload; on 2 workers (`shardfeed launch`) each
rank holds exactly its rows.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from shardfeed import LoadOptions, ShardedResidentDataset, files
from shardfeed._tf import tfdata

ROOT = Path(__file__).resolve().parents[2]
ROWS = 37
FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "vector": tf.io.FixedLenFeature([4], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def _arrays(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, size=(rows, 8, 6, 3), dtype=np.uint8),
        "vector": rng.normal(size=(rows, 4)).astype("float32"),
        "label": rng.integers(0, 10, size=rows).astype("int64"),
    }


def write_tfrecords(directory, arrays, splits=(10, 20), compression=""):
    """Writes `arrays` as TFRecord files cut at `splits` (PNG images)."""
    options = tf.io.TFRecordOptions(compression_type=compression)
    bounds = [0, *splits, len(arrays["label"])]
    paths = []
    for i, (start, stop) in enumerate(itertools.pairwise(bounds)):
        path = os.path.join(directory, f"part-{i:02d}.tfrecord")
        with tf.io.TFRecordWriter(path, options) as writer:
            for r in range(start, stop):
                feature = {
                    "image": tf.train.Feature(
                        bytes_list=tf.train.BytesList(
                            value=[tf.io.encode_png(arrays["image"][r]).numpy()]
                        )
                    ),
                    "vector": tf.train.Feature(
                        float_list=tf.train.FloatList(value=arrays["vector"][r])
                    ),
                    "label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[arrays["label"][r]])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        paths.append(path)
    return paths


def _held(ds):
    """Each column's rows on replica 0, as NumPy arrays."""
    return [v.numpy() for v in ds.stores[0].variables]


@pytest.mark.parametrize("compression", ["", "GZIP", "ZLIB"])
def test_tfrecord_rows_equal_the_arrays_they_were_written_from(tmp_path, compression):
    arrays = _arrays()
    write_tfrecords(tmp_path, arrays, compression=compression)
    cols = files.tfrecord(
        str(tmp_path / "part-*.tfrecord"), FEATURES, images={"image": (8, 6, 3)},
        compression=compression or None,
    )
    assert cols["image"].dtype == np.uint8 and cols["image"].shape == (ROWS, 8, 6, 3)
    ds = ShardedResidentDataset(
        {"image": cols["image"], "vector": cols["vector"]}, cols["label"],
        per_replica_batch_size=8, shuffle=False,
        load_options=LoadOptions(chunk_bytes=7 * 8 * 6 * 3),  # chunks cross files
    )
    image, vector, label = _held(ds)
    for got, want in ((image, "image"), (vector, "vector"), (label, "label")):
        assert got.tobytes() == arrays[want].tobytes()
    # A range in the middle (only the files holding it are read).
    np.testing.assert_array_equal(cols["label"][12:25], arrays["label"][12:25])


def test_tfrecord_given_counts_skip_the_counting_pass_and_are_checked(tmp_path):
    write_tfrecords(tmp_path, _arrays())
    pattern = str(tmp_path / "part-*.tfrecord")
    label = {"label": FEATURES["label"]}
    cols = files.tfrecord(pattern, label, num_records=[10, 10, 17])
    assert cols["label"].shape == (ROWS,)
    with pytest.raises(ValueError, match="must give one non-negative count per file"):
        files.tfrecord(pattern, label, num_records=[10, 27])
    too_many = files.tfrecord(pattern, label, num_records=[10, 10, 18])
    with pytest.raises(ValueError) as err:
        np.asarray(too_many["label"])
    assert "ended after 17 rows, 18 were expected" in str(err.value)


def _damaged_tfrecords(directory):
    """A flipped byte, a truncated file and a GZIP file named as plain."""
    a = _arrays()
    paths = {}
    for name in ("plain", "gzip"):
        os.makedirs(directory / name)
        compression = "GZIP" if name == "gzip" else ""
        paths[name] = write_tfrecords(directory / name, a, splits=(), compression=compression)[0]
    raw = bytearray(Path(paths["plain"]).read_bytes())
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 1
    (directory / "flipped.tfrecord").write_bytes(flipped)
    (directory / "truncated.tfrecord").write_bytes(raw[: len(raw) // 2])
    return paths["gzip"], len(raw)


TFRECORD_DAMAGE = "A TFRecord file must hold whole records whose CRC-32s match, read with the " \
    "compression it was written with. Received: {path} (compression=''): {where}. {fix}"
REWRITE = (
    "The file is damaged or was copied incompletely (a record's length or data does not "
    "match its CRC-32); write it again or copy it again."
)


@pytest.mark.parametrize("counted", [True, False])  # the counting pass, or reading with counts
def test_tfrecord_damage_is_an_error_naming_the_file_and_offset(tmp_path, counted):
    """TF's own DataLossError ("corrupted record at 17162") named no file."""
    gzipped, size = _damaged_tfrecords(tmp_path)
    label = {"label": FEATURES["label"]}
    cases = [
        (tmp_path / "flipped.tfrecord", "corrupted record at byte offset {}", REWRITE),
        (tmp_path / "truncated.tfrecord", "truncated record at byte offset {}", REWRITE),
        (Path(gzipped), "corrupted record at byte offset 0",
         'The file starts with the GZIP magic bytes: pass `compression="GZIP"`.'),
    ]
    for path, where, fix in cases:
        with pytest.raises(ValueError) as err:
            cols = files.tfrecord(path, label, num_records=None if counted else [ROWS])
            ShardedResidentDataset(cols["label"], per_replica_batch_size=4, shuffle=False)
        offset = re.search(r"at byte offset (\d+)", str(err.value))
        assert offset is not None and 0 <= int(offset[1]) < size
        assert str(err.value) == TFRECORD_DAMAGE.format(
            path=path, where=where.format(offset[1]), fix=fix
        )


def test_tfrecord_images_of_another_size_are_refused_or_resized(tmp_path):
    arrays = _arrays()
    write_tfrecords(tmp_path, arrays)
    pattern = str(tmp_path / "part-*.tfrecord")
    image = {"image": FEATURES["image"]}
    wrong = files.tfrecord(pattern, image, images={"image": (4, 4, 3)})
    with pytest.raises(ValueError, match=r"images of the declared shape unless `resize=True`"):
        wrong["image"][0:3]
    resized = files.tfrecord(pattern, image, images={"image": (4, 3, 3)}, resize=True)
    expected = tf.saturate_cast(
        tf.round(tf.image.resize(arrays["image"][:3], (4, 3))), tf.uint8
    ).numpy()
    np.testing.assert_array_equal(resized["image"][0:3], expected)


def test_tfrecord_refuses_string_features_not_declared_as_images(tmp_path):
    write_tfrecords(tmp_path, _arrays())
    with pytest.raises(ValueError) as err:
        files.tfrecord(str(tmp_path / "*.tfrecord"), {"image": FEATURES["image"]})
    assert str(err.value).startswith(
        "Each feature must be a `tf.io.FixedLenFeature` of numbers, or a scalar string "
        "feature listed in `images` (encoded JPEG/PNG). Received: features['image']="
    )
    with pytest.raises(ValueError, match="matches no file"):
        files.tfrecord(str(tmp_path / "nothing-*"), FEATURES)


def test_importing_files_does_not_import_tensorflow():
    code = "import sys, shardfeed.files; print('tensorflow' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False"


# -- from_tf_dataset ------------------------------------------------------------------------


def test_from_tf_dataset_loads_the_rows_byte_equal():
    a = _arrays()
    pipeline = tf.data.Dataset.from_tensor_slices(
        ({"image": a["image"], "vector": a["vector"]}, a["label"], a["vector"][:, 0])
    )
    ds = ShardedResidentDataset.from_tf_dataset(
        pipeline, per_replica_batch_size=8, shuffle=False,
        load_options=LoadOptions(chunk_bytes=100),
    )
    image, vector, label, weight = _held(ds)
    assert image.tobytes() == a["image"].tobytes()
    assert vector.tobytes() == a["vector"].tobytes()
    assert label.tobytes() == a["label"].tobytes()
    assert weight.tobytes() == a["vector"][:, 0].tobytes()
    assert ds.columns.sample_weight is not None


def test_from_tf_dataset_needs_a_known_size():
    pipeline = tf.data.Dataset.from_tensor_slices(np.arange(10.0)).repeat()
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset.from_tf_dataset(pipeline, per_replica_batch_size=2, shuffle=False)
    assert str(err.value) == (
        "A resident dataset needs to know its rows before allocating; a tf.data dataset "
        "must be finite with a known cardinality, or come with `num_rows`. Received: "
        "dataset.cardinality()=infinite. Pass `num_rows=<rows>` (an infinite dataset is cut "
        "there), or `dataset.apply(tf.data.experimental.assert_cardinality(rows))`."
    )
    unknown = tf.data.Dataset.from_tensor_slices(np.arange(10.0)).filter(lambda v: v >= 0)
    with pytest.raises(ValueError, match=r"cardinality\(\)=unknown"):
        ShardedResidentDataset.from_tf_dataset(unknown, per_replica_batch_size=2, shuffle=False)
    ds = ShardedResidentDataset.from_tf_dataset(
        pipeline, num_rows=25, per_replica_batch_size=2, shuffle=False
    )
    np.testing.assert_array_equal(_held(ds)[0], np.arange(25.0) % 10)


def test_from_tf_dataset_refuses_batched_elements():
    batched = tf.data.Dataset.from_tensor_slices(np.zeros((8, 3))).batch(4)
    with pytest.raises(ValueError, match=r"Pass the dataset before `.batch\(...\)`"):
        ShardedResidentDataset.from_tf_dataset(batched, per_replica_batch_size=2, shuffle=False)


def test_shard_major_row_order_with_two_workers():
    """Worker w's block is `dataset.shard(2, w)`: the leaf for two workers
    lists shard 0's rows, then shard 1's; each block drains its own shard."""
    drained = []

    def blocks(w):
        drained.append(w)
        return tf.data.Dataset.from_tensor_slices(np.arange(7)).shard(2, w)

    spec = tf.TensorSpec([], tf.int64)
    cursors = tfdata.block_cursors(blocks, [4, 3], spec, "test")
    leaf = tfdata._ShardedColumn(cursors, 0, [4, 3], spec, "test")
    np.testing.assert_array_equal(leaf[0:4], [0, 2, 4, 6])
    assert drained == [0]
    np.testing.assert_array_equal(np.asarray(leaf), [0, 2, 4, 6, 1, 3, 5])


def _keyed(rows=ROWS):
    """A pipeline's source arrays with a row index, to check pairs after a shuffle."""
    a = _arrays(rows)
    a["index"] = np.arange(rows, dtype=np.int64)
    return a


SHUFFLES = {
    "seeded": lambda ds: ds.shuffle(1000, seed=1),  # reshuffles each pass (TF's default)
    "unseeded": lambda ds: ds.shuffle(1000),
    "fixed": lambda ds: ds.shuffle(1000, seed=1, reshuffle_each_iteration=False),
    "parallel map": lambda ds: ds.map(lambda x, y: (x, y), num_parallel_calls=2),
}


@pytest.mark.parametrize("shuffle", sorted(SHUFFLES))
def test_from_tf_dataset_pairs_each_x_with_its_own_y_after_a_shuffle(shuffle):
    """Every column is read from the same pass: a pipeline that reshuffles on
    each pass gave each column its own order (999 of 1,000 pairs wrong)."""
    a = _keyed(300)
    pipeline = SHUFFLES[shuffle](
        tf.data.Dataset.from_tensor_slices(({"image": a["image"], "index": a["index"]}, a["label"]))
    )
    # Small chunks: many chunks per column, each column's read interleaved.
    ds = ShardedResidentDataset.from_tf_dataset(
        pipeline, per_replica_batch_size=8, shuffle=False,
        load_options=LoadOptions(chunk_bytes=1000),
    )
    image, index, label = _held(ds)
    assert sorted(index.tolist()) == list(range(300))
    assert image.tobytes() == a["image"][index].tobytes()
    assert label.tobytes() == a["label"][index].tobytes()


def test_a_reshuffling_pipeline_read_twice_in_a_process_is_refused():
    """Two replicas on two devices each hold every row (`placement="replicate"`):
    the block is drained twice, and a second pass of `shuffle()` is another order."""
    a = _keyed(40)
    base = tf.data.Dataset.from_tensor_slices((a["vector"], a["label"]))
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset.from_tf_dataset(
            base.shuffle(100, seed=3), per_replica_batch_size=4, shuffle=False,
            placement="replicate", strategy=strategy,
        )
    assert str(err.value) == (
        "A tf.data source read more than once in a process (several replicas holding the "
        'same rows, `placement="replicate"`, or rows of a neighbour worker\'s shard) must '
        "give the same order on every pass. Received: the pipeline has "
        "ShuffleDataset(reshuffle_each_iteration=True). Give the shuffle a seed and "
        "`reshuffle_each_iteration=False` (e.g. `ds.shuffle(n, seed=1, "
        "reshuffle_each_iteration=False)`), or drop it: `ShardedResidentDataset` shuffles "
        "the resident rows itself every epoch (`seed=`)."
    )
    # A fixed order may be read any number of times: both replicas hold the same rows.
    ds = ShardedResidentDataset.from_tf_dataset(
        base.shuffle(100, seed=3, reshuffle_each_iteration=False),
        per_replica_batch_size=4, shuffle=False, placement="replicate", strategy=strategy,
    )
    first, second = ([v.numpy() for v in s.variables] for s in ds.stores)
    assert first[0].tobytes() == second[0].tobytes()
    assert first[1].tobytes() == second[1].tobytes()


@pytest.fixture
def no_global_seed():
    # An earlier test's `keras.utils.set_random_seed` leaves TF's global seed
    # set, and then an unseeded shuffle draws its seed from it: the same in
    # every process that sets the same seed, so no hazard. Clear it here.
    previous = context.global_seed()
    tf.random.set_seed(None)
    yield
    tf.random.set_seed(previous)


def test_an_unseeded_shuffle_under_a_global_seed_has_the_same_order_in_every_process(
    no_global_seed,
):
    tf.random.set_seed(7)
    base = tf.data.Dataset.from_tensor_slices(np.arange(10))
    assert tfdata._order_hazards(base.shuffle(10, reshuffle_each_iteration=False)) == ([], [])


def test_order_hazards_are_read_from_the_pipeline_steps(no_global_seed):
    base = tf.data.Dataset.from_tensor_slices(np.arange(10))
    assert tfdata._order_hazards(base.map(lambda v: v + 1)) == ([], [])
    assert tfdata._order_hazards(base.shuffle(10, seed=1, reshuffle_each_iteration=False)) == (
        [], []
    )
    assert tfdata._order_hazards(base.shuffle(10, reshuffle_each_iteration=False)) == (
        [], ["ShuffleDataset(seed=None)"]
    )
    assert tfdata._order_hazards(base.shuffle(10, seed=1)) == (
        ["ShuffleDataset(reshuffle_each_iteration=True)"], []
    )
    loose = base.map(lambda v: v, num_parallel_calls=2, deterministic=False)
    what = "ParallelMapDataset(deterministic=False)"
    assert tfdata._order_hazards(loose) == ([what], [what])
    # Through the steps after it, and the options.
    after = base.shuffle(10).map(lambda v: v).take(5).shard(2, 0)
    assert tfdata._order_hazards(after) == (
        ["ShuffleDataset(reshuffle_each_iteration=True)"], ["ShuffleDataset(seed=None)"]
    )
    options = tf.data.Options()
    options.deterministic = False
    loose = base.with_options(options)
    what = "options(deterministic=False)"
    assert tfdata._order_hazards(loose) == ([what], [what])


@pytest.mark.parametrize("num_rows", [-5, 0, 2.5, True])
def test_from_tf_dataset_num_rows_must_be_a_positive_integer(num_rows):
    pipeline = tf.data.Dataset.from_tensor_slices(np.arange(10.0)).repeat()
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset.from_tf_dataset(
            pipeline, num_rows=num_rows, per_replica_batch_size=2, shuffle=False
        )
    assert str(err.value) == (
        "`num_rows` must be a positive integer: the rows of the whole dataset. "
        f"Received: num_rows={num_rows!r}. Pass the dataset's row count, or leave "
        "`num_rows` out for a dataset of known cardinality."
    )


def test_a_per_worker_dataset_function_needs_num_rows():
    def per_worker(count, index):
        return tf.data.Dataset.from_tensor_slices(np.arange(9)).shard(count, index)

    with pytest.raises(ValueError, match="come with `num_rows`"):
        ShardedResidentDataset.from_tf_dataset(per_worker, per_replica_batch_size=2, shuffle=False)
    ds = ShardedResidentDataset.from_tf_dataset(
        per_worker, num_rows=9, per_replica_batch_size=2, shuffle=False
    )
    np.testing.assert_array_equal(_held(ds)[0], np.arange(9))


# -- 2 workers -------------------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    import shardfeed
    from shardfeed import files
    sys.path.insert(0, sys.argv[2])
    from test_tfdata import FEATURES, _arrays

    world = shardfeed.init()
    arrays = _arrays()
    cols = files.tfrecord(sys.argv[1] + "/part-*.tfrecord", FEATURES, images={"image": (8, 6, 3)})
    from_files = shardfeed.ShardedResidentDataset(
        cols["image"], cols["label"], per_replica_batch_size=4, shuffle=False,
        strategy=world.strategy)
    pipeline = tf.data.Dataset.from_tensor_slices((arrays["image"], arrays["label"]))
    from_pipeline = shardfeed.ShardedResidentDataset.from_tf_dataset(
        pipeline, per_replica_batch_size=4, shuffle=False, strategy=world.strategy)
    store_f, store_p = from_files.stores[0], from_pipeline.stores[0]
    held = {}
    keyed = tf.data.Dataset.from_tensor_slices(
        ({"image": arrays["image"], "index": np.arange(len(arrays["label"]))}, arrays["label"]))
    for name, shuffled in [
        ("seeded", keyed.shuffle(100, seed=1)),
        ("fixed", keyed.shuffle(100, seed=1, reshuffle_each_iteration=False)),
        ("unseeded", keyed.shuffle(100)),
    ]:
        try:
            ds = shardfeed.ShardedResidentDataset.from_tf_dataset(
                shuffled, per_replica_batch_size=4, shuffle=False, strategy=world.strategy)
        except ValueError as err:
            held[name + "_error"] = str(err)
            continue
        for leaf, variable in zip(("image", "index", "label"), ds.stores[0].variables):
            held[f"{name}_{leaf}"] = variable.numpy()
    np.savez(
        f"{sys.argv[1]}/rank{world.rank}.npz",
        f_range=[store_f.row_start, store_f.row_stop],
        f_image=store_f.variables[0].numpy(), f_label=store_f.variables[1].numpy(),
        p_range=[store_p.row_start, store_p.row_stop],
        p_image=store_p.variables[0].numpy(), p_label=store_p.variables[1].numpy(),
        **held,
    )
    """
)


@pytest.mark.multi_process
@pytest.mark.slow
def test_two_workers_each_hold_their_rows_byte_equal(tmp_path):
    arrays = _arrays()
    write_tfrecords(tmp_path, arrays)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("TF_CONFIG", "SHARDFEED_RANK", "SHARDFEED_WORLD_SIZE"):
        env.pop(name, None)
    shardfeed_bin = Path(sys.executable).parent / "shardfeed"
    proc = subprocess.run(
        [str(shardfeed_bin), "launch", "--num-workers", "2", "--engine", "multiworker",
         "--timeout-s", "200", str(script), str(tmp_path), str(ROOT / "tests" / "_tf")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # shard-major blocks of ds.shard(2, w): rows w, w + 2, ... (19 and 18 rows).
    by_shard = [np.arange(w, ROWS, 2) for w in range(2)]
    for rank in range(2):
        res = np.load(tmp_path / f"rank{rank}.npz")
        start, stop = res["f_range"]
        assert (start, stop) == ((0, 19), (19, 37))[rank]
        assert res["f_image"].tobytes() == arrays["image"][start:stop].tobytes()
        assert res["f_label"].tobytes() == arrays["label"][start:stop].tobytes()
        assert tuple(res["p_range"]) == (start, stop)
        assert res["p_image"].tobytes() == arrays["image"][by_shard[rank]].tobytes()
        assert res["p_label"].tobytes() == arrays["label"][by_shard[rank]].tobytes()
    # Shuffled pipelines: each rank's (x, y) pairs are the source's, and the
    # ranks together hold every row once (a seeded shuffle, reshuffling or
    # not, has the same first-pass order in both processes).
    results = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(2)]
    for name in ("seeded", "fixed"):
        for res in results:
            index = res[f"{name}_index"]
            assert res[f"{name}_image"].tobytes() == arrays["image"][index].tobytes()
            assert res[f"{name}_label"].tobytes() == arrays["label"][index].tobytes()
        both = np.concatenate([res[f"{name}_index"] for res in results])
        assert sorted(both.tolist()) == list(range(ROWS))
    # An unseeded shuffle gives each process its own order: refused on every rank.
    for res in results:
        assert str(res["unseeded_error"]) == (
            "On several workers every worker drains its shard of the same pipeline, so the "
            "pipeline's row order must be the same in every process; an unseeded shuffle (or "
            "an op with `deterministic=False`) gives each worker its own order, and rows "
            "would be held twice or never. Received: the pipeline has "
            "ShuffleDataset(seed=None), workers=2. Seed the shuffle (`ds.shuffle(n, "
            "seed=1)`, or `tf.random.set_seed` in every worker), or drop it: "
            "`ShardedResidentDataset` shuffles the resident rows itself every epoch (`seed=`)."
        )
