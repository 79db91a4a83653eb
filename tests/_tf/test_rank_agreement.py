"""Ranks that pass different rows, and a chief that cannot write, on 2 workers.

The agreement check (`_data/agreement.py`): each worker hashes the same few
seeded rows of its full arrays and the workers compare them, with the row
count and each column's shape and dtype, before anything is uploaded. 1,000
rows on rank 0 and 1,037 on rank 1, or the same rows permuted per rank (an
unseeded shuffle before the split), raise the same error on both ranks, in
`fit`, `evaluate` and `predict`; the same rows pass. A chief that cannot
write (`save_model`, `BackupAndRestore`) raises "rank 0 could not write ..."
on both ranks (`_tf/saving.py` `write_on_chief`). Every run is bounded
by the launcher's and the test's timeouts: no rank may hang.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from _helpers_horovod import NO_HOROVOD
from _helpers_workers import ROOT, launch_command, run_checked
from _ranks_worker import assert_fit_case_outcomes

import shardfeed
from shardfeed import LoadOptions, ShardedResidentDataset, files
from shardfeed import augment as aug
from shardfeed._common import agreement as call_agreement
from shardfeed._common import model_sync
from shardfeed._data import agreement
from shardfeed._data.sources import columns_from_arrays
from shardfeed._training import fit_args

WORKER = Path(__file__).resolve().parents[1] / "_ranks_worker.py"
# Set-up (two TensorFlow workers) takes ~15 s here, a case a few more; a hang
# would take the launcher's timeout (TIMEOUT_S - 20 = 220 s).
BOUNDED_S = 120
SHARED_BOUNDED_S = 180  # the shared job's eight cases


def _job(tmp_path, *cases, engine="multiworker", bounded_s=BOUNDED_S):
    """Runs the cases (each `(task, mode, arg)`, in order) in one job of 2
    workers; per case, each rank's outcome."""
    out = tmp_path / "res"
    argv = [word for case in cases for word in ("--case", *case)]
    start = time.monotonic()
    run_checked(launch_command(2, str(WORKER), *argv, "--out", str(out), engine=engine), ROOT)
    assert time.monotonic() - start < bounded_s
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(2)]
    assert [len(outcomes) for outcomes in ranks] == [len(cases)] * 2
    return [list(case) for case in zip(*ranks, strict=True)]


def _outcomes(tmp_path, *case, engine="multiworker"):
    """One case in a job of its own: each rank's outcome."""
    return _job(tmp_path, case, engine=engine)[0]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The two-worker cases on the multiworker engine, in one job (CI time: one
    launch of 2 TensorFlow workers instead of eight, ~85 s of CI's CPU); each
    test below asserts on its case's outcomes. The chief's failed writes come
    last: they raise on every rank together too, so every case after a refusal
    still starts in step (the cases of `fitargs` show that within one call)."""
    tmp = tmp_path_factory.mktemp("ranks")
    # We run as root, so permissions stop nothing: a regular file as the parent does.
    blocker = tmp / "not_a_dir"
    blocker.write_text("")
    paths = {"save_model": blocker / "model.keras", "backup": blocker / "backup"}
    cases = {
        "rows predict": ("data", "rows", "predict"),
        "rows fit": ("data", "rows", "fit"),
        "permuted": ("data", "permuted", "fit"),
        "seed": ("data", "seed", "fit"),
        "transform": ("data", "transform", "fit"),
        "same": ("data", "same", "fit"),
        "fitargs": ("fitargs", "all", "fit"),
        "save_model": ("save", "save_model", str(paths["save_model"])),
        "backup": ("save", "backup", str(paths["backup"])),
    }
    outcomes = _job(tmp, *cases.values(), bounded_s=SHARED_BOUNDED_S)
    return {"paths": paths, **dict(zip(cases, outcomes, strict=True))}


# -- one process: the fingerprint and the words --------------------------------


def _prints(*arrays):
    return [agreement.fingerprint(columns_from_arrays(x)) for x in arrays]


def test_sampled_rows_are_a_function_of_the_row_count_alone():
    assert agreement.sample_rows(1000) == agreement.sample_rows(1000)
    assert agreement.sample_rows(1000) != agreement.sample_rows(1037)
    assert len(agreement.sample_rows(1000)) == agreement.SAMPLE_ROWS
    assert agreement.sample_rows(5) == [0, 1, 2, 3, 4]  # fewer rows than samples: all
    assert agreement.sample_rows(1000, "leading") == list(range(agreement.SAMPLE_ROWS))
    assert agreement.sample_rows(1000, "none") == []


def test_differences_are_named_with_the_ranks():
    x = np.arange(4000, dtype="float32").reshape(1000, 4)
    other = np.arange(4148, dtype="float32").reshape(1037, 4)
    diff = agreement._first_difference
    assert diff(_prints(x, x)) is None
    assert diff(_prints(x, other)) == "rank 1 has 1037 rows, rank 0 has 1000"
    assert diff(_prints(x, x.astype("float64"))) == (
        "column x: rank 1 has row dtype <f8, rank 0 has <f4"
    )
    assert diff(_prints(x, x.reshape(1000, 2, 2))) == (
        "column x: rank 1 has row shape [2, 2], rank 0 has [4]"
    )
    assert diff(_prints({"a": x}, {"b": x})) == "rank 1 has columns x['b'], rank 0 has x['a']"
    permuted = x[np.random.default_rng(3).permutation(1000)]
    message = diff(_prints(x, x, permuted))
    rows = ", ".join(str(r) for r in agreement.sample_rows(1000)[:6])
    assert message == (
        f"column x: rows {rows}, ... differ between ranks 0 and 2 (16 of the 16 rows "
        "compared): the arrays were shuffled or loaded differently per rank"
    )


def test_sources_that_stream_are_sampled_from_their_start_or_not_at_all(tmp_path):
    x = np.arange(400, dtype="float32").reshape(100, 4)
    np.savez_compressed(tmp_path / "c.npz", x=x)
    np.save(tmp_path / "a.npy", x)
    deflated = files.npz(tmp_path / "c.npz", "x")
    assert agreement._access(files.npy(tmp_path / "a.npy")) == "any"
    assert agreement._access(deflated) == "leading"
    assert agreement._access(files.concat([files.npy(tmp_path / "a.npy"), deflated])) == (
        "leading"
    )
    pipeline = ShardedResidentDataset.from_tf_dataset(
        tf.data.Dataset.from_tensor_slices(x), per_replica_batch_size=10, shuffle=False
    )
    assert agreement._access(pipeline.columns.columns[0].data) == "none"
    # The same rows give the same fingerprint from an array and from files.
    assert _prints(x) == [agreement.fingerprint(columns_from_arrays(files.npy(tmp_path / "a.npy")))]


def test_check_agreement_must_be_a_bool():
    with pytest.raises(ValueError, match=r"check_agreement=1"):
        LoadOptions(check_agreement=1)  # type: ignore[arg-type]


# -- two workers ---------------------------------------------------------------


def _assert_both_refuse(outcomes, difference):
    for outcome in outcomes:
        assert outcome.startswith("ValueError: Every worker must build the dataset from the "
                                  "same rows in the same order"), outcome
        assert f"Received: {difference}" in outcome, outcome
        assert "seed the shuffle or split before building it" in outcome
        assert "LoadOptions(check_agreement=False)" in outcome


@pytest.mark.multi_process
@pytest.mark.slow
@pytest.mark.parametrize("call", ["predict", "fit"])
def test_two_workers_with_other_row_counts_both_raise(call, shared):
    outcomes = shared[f"rows {call}"]
    if call == "fit":  # a dataset of each rank's rows: the rows' agreement
        _assert_both_refuse(outcomes, "rank 1 has 1037 rows, rank 0 has 1000")
    else:
        _assert_both_refuse_predict_rows(outcomes)


def _assert_both_refuse_predict_rows(outcomes):
    # Arrays: their rows are compared with the call's other arguments, before
    # the batch derived from them (1,000 against 500 rows named a batch of 250
    # against 256, a size nobody passed).
    for outcome in outcomes:
        assert outcome.startswith(
            "ValueError: Every worker must call `predict` with the same arguments: they "
            "decide how many steps and collectives each rank runs. Received: ranks disagree "
            "on predict's `data rows`: rank 0 has 1000, rank 1 has 1037."
        ), outcome


@pytest.mark.multi_process
@pytest.mark.slow
def test_two_workers_with_rows_permuted_per_rank_both_raise(shared):
    outcomes = shared["permuted"]
    _assert_both_refuse(outcomes, "column x: rows ")
    assert "differ between ranks 0 and 1" in outcomes[0]
    assert "the arrays were shuffled or loaded differently per rank" in outcomes[0]


@pytest.mark.multi_process
@pytest.mark.slow
@pytest.mark.parametrize(
    "case, received",
    [
        # Before: rc 0, and each epoch about a quarter of the rows trained twice, as many never.
        ("seed", "rank 1 has seed=1, rank 0 has 0. Pass the same dataset arguments on every "
         "worker"),
        # Rank 1 without `/ 255` trained wrong without a word (issue 37: loss 20.7, rc 0).
        ("transform", "rank 1 has transform='case_outcome.<locals>.<lambda> #"),
    ],
)
def test_two_workers_with_other_dataset_arguments_both_raise(shared, case, received):
    for outcome in shared[case]:
        assert outcome.startswith(
            "ValueError: Every worker must build the dataset with the same arguments. "
            f"Received: {received}"
        ), outcome


def test_functions_are_compared_by_their_code_and_values_not_their_identity():
    fp = agreement.function_fingerprint
    source = "def scale(x):\n    return x / 255.0\n"
    copies = []
    for _ in range(2):  # two function objects of one source: two ranks' `transform`
        space = {}
        exec(compile(source, "rank.py", "exec"), space)
        copies.append(space["scale"])
    assert copies[0] is not copies[1] and fp(copies[0]) == fp(copies[1])
    assert fp(copies[0]).startswith("scale #")
    assert fp(lambda x: x / 255.0) != fp(lambda x: x)  # code

    def scaled_by(factor):
        return lambda x: x / factor

    assert fp(scaled_by(255.0)) == fp(scaled_by(255.0)) != fp(scaled_by(1.0))  # closures
    assert fp(aug.translate(2)) == fp(aug.translate(2)) != fp(aug.translate(3))  # blocks
    assert fp(aug.compose(aug.flip_left_right(), aug.translate(2))) != fp(
        aug.compose(aug.flip_left_right(), aug.translate(2, fill=0))
    )
    def centered(mean):
        return lambda x: x - mean

    zeros = np.zeros(4, "float32")
    assert fp(centered(zeros)) == fp(centered(zeros.copy())) != fp(centered(zeros + 1))
    assert fp(None) is None

    class Reduces:  # a sync-on-read variable: reading an attribute is a reduction
        def __getattr__(self, name):
            raise ValueError("Could not convert from `tf.VariableAggregation`")

    touchy = Reduces()
    assert fp(lambda x: (touchy, x)).startswith(  # by its type, nothing read
        "test_functions_are_compared_by_their_code_and_values_not_their_identity.<locals>."
    )


def test_settings_are_compared_before_rows():
    options = LoadOptions()
    mine = agreement.dataset_settings(per_replica_batch_size=64, drop_remainder=False,
                                      placement="shard", shuffle=True, seed=0, options=options)
    other = {**mine, "per_replica_batch_size": 32, "LoadOptions.exchange_fraction": 0.5}
    diff = agreement._first_setting_difference
    assert diff([{"settings": mine}, {"settings": mine}]) is None
    assert diff([{"settings": mine}, {"settings": other}]) == (
        "rank 1 has LoadOptions.exchange_fraction=0.5, rank 0 has 1.0"
    )
    assert diff([{"settings": mine}, {"settings": {**mine, "shuffle": "local"}}]) == (
        "rank 1 has shuffle='local', rank 0 has True"
    )
    assert agreement.dataset_settings(
        per_replica_batch_size=np.int64(64), drop_remainder=False, placement="shard",
        shuffle=True, seed=None, options=options,
    )["per_replica_batch_size"] == 64


@pytest.mark.multi_process
@pytest.mark.slow
def test_two_workers_with_the_same_rows_pass(shared):
    assert shared["same"] == ["ok", "ok"]


@pytest.mark.multi_process
@pytest.mark.slow
@pytest.mark.horovod
@NO_HOROVOD
def test_horovod_ranks_with_other_row_counts_both_raise(tmp_path):
    _assert_both_refuse_predict_rows(
        _outcomes(tmp_path, "data", "rows", "predict", engine="horovod")
    )


@pytest.mark.multi_process
@pytest.mark.slow
@pytest.mark.parametrize(
    ("what", "engine"),
    [
        ("save_model", "multiworker"),
        ("backup", "multiworker"),
        pytest.param("save_model", "horovod", marks=[pytest.mark.horovod, NO_HOROVOD]),
    ],
)
def test_a_chief_that_cannot_write_fails_every_rank_by_name(what, engine, tmp_path, request):
    if engine == "multiworker":  # in the shared job
        shared = request.getfixturevalue("shared")
        path, outcomes = shared["paths"][what], shared[what]
    else:
        # We run as root, so permissions stop nothing: a regular file as the parent does.
        blocker = tmp_path / "not_a_dir"
        blocker.write_text("")
        path = blocker / ("model.keras" if what == "save_model" else "backup")
        outcomes = _outcomes(tmp_path, "save", what, str(path), engine=engine)
    for outcome in outcomes:
        assert outcome.startswith(f"ChiefWriteError: rank 0 could not write {path}: "), outcome
        assert "NotADirectoryError" in outcome, outcome



# -- fit's own arguments ---------------------------------------------------------

def test_call_settings_name_the_setting_and_each_differing_rank():
    diff = call_agreement.settings_difference
    assert diff("fit", [{"epochs": 3}, {"epochs": 3}]) is None
    assert diff("fit", [{"epochs": 3, "x": 1}, {"epochs": 2, "x": 2}, {"epochs": 3}]) == (
        "ranks disagree on fit's `epochs`: rank 0 has 3, rank 1 has 2"
    )
    assert diff("fit", [{"a": None}, {"a": "auto"}, {"a": None}, {"a": True}]) == (
        "ranks disagree on fit's `a`: rank 0 has None, rank 1 has 'auto', rank 3 has True"
    )
    many = [{"n": 0}] + [{"n": r} for r in range(1, 9)]
    assert diff("fit", many).endswith("rank 6 has 6 (and 2 more ranks)")
    # A setting one rank lacks differs too.
    assert diff("fit", [{"a": 1}, {"a": 1, "b": 2}]) == (
        "ranks disagree on fit's `b`: rank 0 has None, rank 1 has 2"
    )
    # Values as JSON: NumPy scalars as numbers, mappings by sorted keys, objects by type.
    assert call_agreement.plain({1: np.float32(0.5), 0: np.int64(2)}) == {"0": 2, "1": 0.5}
    assert call_agreement.plain((object(), [True])) == ["object", [True]]


def test_evaluate_settings_count_the_rows_of_arrays():
    from shardfeed._training import eval_args

    x = np.zeros((1000, 4), "float32")
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    settings = eval_args.settings(model, {"a": x, "b": x}, None, ShardedResidentDataset)
    assert (settings["data"], settings["data rows"]) == ("arrays", 1000)
    ds = ShardedResidentDataset(x, x[:, :1], per_replica_batch_size=50, shuffle=False)
    settings = eval_args.settings(model, ds, None, ShardedResidentDataset)
    assert "data rows" not in settings and settings["data steps"] == 20


def test_fit_settings_describe_what_decides_the_steps():
    x = np.zeros((1000, 4), "float32")
    ds = ShardedResidentDataset(x, x[:, :1], per_replica_batch_size=50, shuffle=False)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    given = {"epochs": 2, "initial_epoch": 0, "initial_step": 0, "steps_per_epoch": None,
             "validation_data": None, "validation_split": 0.0, "validation_freq": [1, 2],
             "class_weight": {1: 2.0}, "options": None,
             "callbacks": [tf.keras.callbacks.BackupAndRestore("b", save_freq=4),
                           tf.keras.callbacks.TerminateOnNaN()]}
    settings = fit_args.settings(model, ds, fit_args.FitArguments(**given))
    assert settings["dataset steps per epoch"] == 20
    assert settings["validation_freq"] == [1, 2]
    assert settings["class_weight"] == {"1": 2.0}
    assert settings["BackupAndRestore save_freq"] == [4]
    assert settings["options.steps_per_execution"] == "auto"
    assert settings["compile's steps_per_execution"] == 1
    with_data = fit_args.settings(
        model, ds, fit_args.FitArguments(**{**given, "validation_data": ds})
    )
    assert with_data["validation_data"] == {"rows": 1000, "per_replica_batch_size": 50}


@pytest.mark.multi_process
@pytest.mark.slow
def test_two_workers_with_other_fit_arguments_both_raise(shared):
    assert_fit_case_outcomes(shared["fitargs"])


def test_sync_model_names_a_model_built_otherwise_on_a_rank():
    check = model_sync._check_structure
    dense = [["dense/kernel", [4, 1], "<f4", "a"], ["dense/bias", [1], "<f4", "b"]]
    check([dense, [[*v[:3], "other hash"] for v in dense]])  # values may differ: copied
    with pytest.raises(ValueError) as info:
        check([dense, dense, dense[:1]])
    assert str(info.value) == (
        "Every worker must build the same model (the same layers, in the same order, built "
        "on inputs of the same shapes) before its weights can be made identical. Received: "
        "rank 2 has 1 variables, rank 0 has 2. Build the model from the same code and input "
        "shapes on every worker, and build it (and its optimizer) before `sync_model`."
    )
    with pytest.raises(ValueError, match=r"Received: rank 1 has variable dense/kernel \[4, 2\] "
                       r"<f4, rank 0 has dense/kernel \[4, 1\] <f4\."):
        check([dense, [["dense/kernel", [4, 2], "<f4", "a"], dense[1]]])


class _Variable:
    """What `model_sync` reads of a variable: `path`, `shape`, `value`."""

    def __init__(self, path, value):
        self.path, self.value = path, np.asarray(value, np.float32)
        self.shape = self.value.shape


class _Ranks:
    """A `WorldLike` of rank 0 whose all-gather hands back the other ranks' payloads."""

    rank = 0

    def __init__(self, *others):
        self.world_size, self.others = 1 + len(others), others

    def all_gather_bytes(self, payload):
        return [payload, *self.others]


def _fingerprints(variables):
    return json.dumps(model_sync._fingerprint(model_sync._host_values(variables), variables))


def test_the_in_sync_check_names_the_first_variable_any_rank_differs_in():
    """One rule with TensorFlow's per-replica fit check (`Divergence`): the first
    variable that differs on any rank, every rank that differs in it, and how
    many variables differ on any rank. Before, the first rank that differed at
    all was named with its own count: here "variable b differs between ranks 0
    and 1 (1 of 2 variables differ)", rank 2's other kernel unsaid."""
    mine = [_Variable("a", [0, 0]), _Variable("b", [0])]
    rank_1 = [_Variable("a", [0, 0]), _Variable("b", [1])]
    rank_2 = [_Variable("a", [5, 5]), _Variable("b", [0])]
    world = _Ranks(_fingerprints(rank_1).encode(), _fingerprints(rank_2).encode())
    with pytest.raises(ValueError) as info:
        model_sync.check_in_sync(world, mine, "save one model file")
    assert "Received: variable a differs on ranks [2] from rank 0 (2 of 2 variables differ). " in (
        str(info.value)
    )
    same = _Ranks(_fingerprints(mine).encode(), _fingerprints(mine).encode())
    model_sync.check_in_sync(same, mine, "save one model file")  # nothing differs


@pytest.mark.parametrize(
    ("prints", "expected"),
    [
        ([["x", "y"], ["x", "y"]], None),
        ([["x", "y"], ["x", "z"], ["w", "y"]], model_sync.Divergence(0, (2,), 2, 2)),
        ([["x", "y"], ["x", "z"], ["x", "z"]], model_sync.Divergence(1, (1, 2), 1, 2)),
        ([[(1, 2)], [(1, 3)]], model_sync.Divergence(0, (1,), 1, 1)),  # TF's two checksums
    ],
)
def test_divergence(prints, expected):
    assert model_sync.Divergence.of(prints) == expected


def test_the_same_model_with_other_generated_names_is_the_same_structure():
    # A model built twice on one rank (`sequential_1/dense_1`) beside
    # `sequential/dense` elsewhere trained, then `save_model`, `predict` and
    # `evaluate` refused: "Every worker must build the same model".
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.optimizer.build(model.trainable_variables)
        return model

    first, again = build(), build()
    prints = []
    for model in (first, again):
        variables = model_sync.model_variables(model)
        prints.append(model_sync._fingerprint(model_sync._host_values(variables), variables))
    assert prints[0][0][0] != prints[1][0][0]  # generated names differ: dense vs dense_2
    model_sync._check_structure(prints)
    renamed = [[f"encoder_{p}", *rest] for p, *rest in prints[1]]
    with pytest.raises(ValueError, match="Every worker must build the same model"):
        model_sync._check_structure([prints[0], renamed])  # a name of the user's own


def test_sync_model_with_one_worker_copies_nothing():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    assert shardfeed.sync_model(model) == 0


@pytest.mark.multi_process
@pytest.mark.slow
def test_two_workers_decide_together_whether_rows_stream(tmp_path):
    """Rank 1 alone has too little device memory for its shard. Under
    `streaming="auto"` both stream, in the same chunks (before: rank 1 alone
    streamed and the job hung until the launcher's timeout); where streaming is
    not possible (the global shuffle) or off, both refuse, naming rank 1."""
    local, global_, off = _job(
        tmp_path, ("memory", "local", "auto"), ("memory", "global", "auto"),
        ("memory", "local", "off"),
    )
    assert local == ["ok: StreamLayout(chunk_steps=4, per_replica_batch_size=50)"] * 2
    for outcome in global_:
        assert outcome.startswith("MemoryError: The global shuffle (shuffle=True) of sharded "
                                  "rows needs every shard resident"), outcome
        assert "Received: rank 1: needed_bytes=" in outcome, outcome
    for outcome in off:
        assert outcome.startswith("MemoryError: The resident data must fit in 80% of the free "
                                  "memory on rank 1's "), outcome
        assert "Received: rank 1: needed_bytes=" in outcome, outcome
    assert global_[0] == global_[1] and off[0] == off[1]
