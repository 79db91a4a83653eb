"""`shardfeed split` and `files.manifest`: layout, checksums, lazy checks, CLI, errors."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle

import keras
import numpy as np
import pyarrow.parquet as pq
import pytest

import shardfeed
from shardfeed import files
from shardfeed._commands import cli as _cli
from shardfeed._commands import split as _split
from shardfeed._data.plan import split_rows

ROWS = 103


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(ROWS, 4, 2)).astype("float32"),
        "y": np.arange(ROWS, dtype="int64"),
        "mask": np.arange(ROWS) % 3 == 0,
        "img": rng.integers(0, 255, size=(ROWS, 3), dtype="uint8"),
    }


def _ranges(num_shards: int) -> list[tuple[int, int]]:
    # Every shard boundary, one row either side of it, and the whole range.
    out = [(0, ROWS), (ROWS - 1, ROWS), (0, 1)]
    for _, stop in split_rows(ROWS, num_shards)[:-1]:
        out += [(stop - 1, stop + 1), (stop - 5, stop + 30), (stop, stop)]
    return out


@pytest.mark.parametrize("file_format", ["npy", "parquet"])
@pytest.mark.parametrize("num_shards", [1, 4])
def test_split_round_trips_every_range(tmp_path, file_format, num_shards):
    arrays = _arrays()
    path = files.split(arrays, tmp_path / "out", num_shards, file_format, chunk_bytes=100)
    leaves = files.manifest(path)
    assert list(leaves) == list(arrays)
    for name, array in arrays.items():
        assert leaves[name].shape == array.shape and leaves[name].dtype == array.dtype
        for start, stop in _ranges(num_shards):
            np.testing.assert_array_equal(
                leaves[name][start:stop], array[start:stop], err_msg=f"{name}[{start}:{stop}]"
            )


def test_manifest_records_rows_dtypes_and_checksums(tmp_path):
    arrays = _arrays()
    path = files.split(arrays, tmp_path, 4, chunk_bytes=64)
    assert path == tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    assert {k: manifest[k] for k in ("format", "format_version", "file_format")} == {
        "format": "shardfeed.split",
        "format_version": 1,
        "file_format": "npy",
    }
    assert manifest["num_rows"] == ROWS and manifest["num_shards"] == 4
    assert manifest["arrays"] == {
        "x": {"dtype": "<f4", "row_shape": [4, 2]},
        "y": {"dtype": "<i8", "row_shape": []},
        "mask": {"dtype": "|b1", "row_shape": []},
        "img": {"dtype": "|u1", "row_shape": [3]},
    }
    # Balanced and contiguous, as the plan gives replicas: 26, 26, 26, 25.
    assert [(s["row_start"], s["row_stop"]) for s in manifest["shards"]] == list(
        split_rows(ROWS, 4)
    )
    assert [s["num_rows"] for s in manifest["shards"]] == [26, 26, 26, 25]
    for shard in manifest["shards"]:
        for name, entry in shard["files"].items():
            assert entry["path"] == f"{name}-{shard['shard_index']:05d}-of-00004.npy"
            data = (tmp_path / entry["path"]).read_bytes()
            assert entry["bytes"] == len(data)
            assert entry["sha256"] == hashlib.sha256(data).hexdigest()
            rows = np.load(tmp_path / entry["path"])  # plain .npy files
            np.testing.assert_array_equal(
                rows, arrays[name][shard["row_start"] : shard["row_stop"]]
            )


def test_split_streams_from_file_leaves(tmp_path):
    x = _arrays()["x"]
    np.save(tmp_path / "x.npy", x)
    path = files.split({"x": files.npy(tmp_path / "x.npy")}, tmp_path / "out", 3, "parquet")
    np.testing.assert_array_equal(files.manifest(path)["x"][:], x)


def _corrupt(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(data))


def test_checksums_are_verified_lazily_per_file(tmp_path):
    arrays = _arrays()
    files.split(arrays, tmp_path, 4)
    bad = tmp_path / "x-00001-of-00004.npy"
    _corrupt(bad)
    leaves = files.manifest(tmp_path)  # builds without reading shard files
    # Rows of shards 0, 2 and 3 read fine: a worker checks only its files.
    np.testing.assert_array_equal(leaves["x"][0:26], arrays["x"][0:26])
    np.testing.assert_array_equal(leaves["x"][52:ROWS], arrays["x"][52:ROWS])
    with pytest.raises(ValueError) as info:
        leaves["x"][20:30]  # crosses into shard 1
    message = str(info.value)
    assert message.startswith(
        f"A shard file's sha256 must match the manifest. Received: {bad} sha256="
    )
    assert message.endswith(
        "The file changed or was copied incompletely; copy it again (or split again). "
        "Pass `verify=False` only to skip the check."
    )
    # A leaf sent to a worker checks again there; verify=False skips the check.
    with pytest.raises(ValueError, match=r"sha256 must match"):
        pickle.loads(pickle.dumps(leaves["x"]))[26:27]
    assert files.manifest(tmp_path, verify=False)["x"][26:52].shape == (26, 4, 2)


def test_manifest_refuses_truncated_and_missing_shards(tmp_path):
    files.split(_arrays(), tmp_path, 2)
    shard = tmp_path / "y-00001-of-00002.npy"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 8)
    with pytest.raises(ValueError) as info:
        files.manifest(tmp_path)
    assert str(info.value) == (
        "A shard file must have the size the manifest records. Received: "
        f"{shard} expected_bytes={size}, actual_bytes={size - 8}. The file is truncated "
        "or was replaced; copy it again."
    )
    shard.unlink()
    with pytest.raises(FileNotFoundError) as info:
        files.manifest(tmp_path)
    assert str(info.value) == (
        f"Every shard file the manifest lists must exist. Received: {shard} (array 'y', "
        "rows [52, 103)). Copy the whole split directory, or split the data again."
    )


@pytest.mark.timeout(60)  # a FIFO manifest blocked its read forever
def test_manifest_refuses_a_fifo_in_place_of_the_manifest_or_a_shard(tmp_path):
    files.split(_arrays(), tmp_path, 2)
    shard = tmp_path / "y-00001-of-00002.npy"
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(ValueError) as info:
        files.manifest(tmp_path)
    assert str(info.value) == (
        "Every shard file the manifest lists must be a regular file. Received: "
        f"{shard} is a FIFO (named pipe) (array 'y', rows [52, 103)). Put the file "
        "`shardfeed split` wrote in its place (copy the whole split directory again), or "
        "split the data again."
    )
    manifest = tmp_path / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(ValueError) as info:
        files.manifest(tmp_path)
    assert str(info.value) == (
        "The split dataset's manifest must be a regular file. Received: "
        f"{manifest} is a FIFO (named pipe). Pass the manifest.json `shardfeed split "
        "--out` wrote (copy the split directory again)."
    )


def test_manifest_refuses_a_shard_from_another_split(tmp_path):
    files.split({"x": np.zeros((10, 2), "float32")}, tmp_path / "a", 2)
    files.split({"x": np.zeros((10, 2), "float64")}, tmp_path / "b", 2, chunk_bytes=1)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    other = tmp_path / "b" / "x-00000-of-00002.npy"
    (tmp_path / "a" / "x-00000-of-00002.npy").write_bytes(other.read_bytes())
    entry = manifest["shards"][0]["files"]["x"]
    entry["bytes"] = other.stat().st_size
    entry["sha256"] = hashlib.sha256(other.read_bytes()).hexdigest()
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        ValueError,
        match=r"Received: .*x-00000-of-00002\.npy shape=\(5, 2\) dtype=float64, "
        r"manifest shape=\(5, 2\) dtype=float32\.",
    ):
        files.manifest(tmp_path / "a")["x"][0:1]


def _point_entry_at(split_dir, target, name: str) -> None:
    """Makes shard 0's "x" entry name `name`, with `target`'s true size and sha256."""
    manifest = json.loads((split_dir / "manifest.json").read_text())
    entry = manifest["shards"][0]["files"]["x"]
    data = target.read_bytes()
    entry.update(path=name, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (split_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "how",
    [
        "absolute",  # "/.../outside/secret.npy"
        "dotdot",  # "../outside/secret.npy"
        "symlink",  # "link.npy" -> ../outside/secret.npy
        "symlinked_dir",  # "sub/secret.npy" with sub -> ../outside
    ],
)
def test_manifest_paths_cannot_leave_its_directory(tmp_path, how):
    split_dir, outside = tmp_path / "split", tmp_path / "outside"
    files.split({"x": np.zeros((10, 2), "float32")}, split_dir, 2)
    outside.mkdir()
    secret = outside / "secret.npy"
    np.save(secret, np.full((5, 2), 7.0, "float32"))  # a valid shard, by size and hash
    if how == "absolute":
        name = str(secret)
    elif how == "dotdot":
        name = "../outside/secret.npy"
    elif how == "symlink":
        (split_dir / "link.npy").symlink_to(secret)
        name = "link.npy"
    else:
        (split_dir / "sub").symlink_to(outside, target_is_directory=True)
        name = "sub/secret.npy"
    _point_entry_at(split_dir, secret, name)
    with pytest.raises(ValueError) as info:
        files.manifest(split_dir)
    message = str(info.value)
    assert message == (
        "A manifest's shard files must lie inside the manifest's directory: relative paths "
        "that stay inside it after `..` and symlinks are resolved. Received: "
        f"{split_dir / 'manifest.json'} shards[0].files['x'].path={name!r}. Copy the shard "
        "files into the manifest's directory and list them by name, or split the data again "
        "with `shardfeed split`."
    )
    # Nothing about the outside file is disclosed, even when the manifest's numbers are wrong.
    manifest = json.loads((split_dir / "manifest.json").read_text())
    manifest["shards"][0]["files"]["x"].update(bytes=1, sha256="0" * 64)
    (split_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as info:
        files.manifest(split_dir)
    assert str(info.value) == message
    assert str(secret.stat().st_size) not in message


def test_manifest_paths_may_use_subdirectories_and_links_inside_it(tmp_path):
    split_dir = tmp_path / "split"
    x = np.arange(20, dtype="float32").reshape(10, 2)
    files.split({"x": x}, split_dir, 2)
    (split_dir / "sub").mkdir()
    shard = split_dir / "x-00000-of-00002.npy"
    shard.rename(split_dir / "sub" / shard.name)
    (split_dir / "link.npy").symlink_to(split_dir / "sub" / shard.name)
    for name in (f"sub/{shard.name}", f"sub/../sub/{shard.name}", "link.npy"):
        _point_entry_at(split_dir, split_dir / "sub" / shard.name, name)
        np.testing.assert_array_equal(files.manifest(split_dir)["x"][:], x)


_MISSING = object()


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"path": _MISSING}, "path=None (needs a non-empty string)"),  # the raw KeyError before
        ({"path": 7}, "path=7 (needs a non-empty string)"),
        ({"path": ""}, "path='' (needs a non-empty string)"),
        ({"bytes": "128"}, "bytes='128' (needs an integer)"),
        ({"bytes": True}, "bytes=True (needs an integer)"),  # bool is not a byte count
        ({"bytes": -1}, "bytes=-1 (needs an integer >= 0)"),
        ({"sha256": _MISSING}, "sha256=None (needs 64 lowercase hex digits)"),
        ({"sha256": "abc"}, "sha256='abc' (needs 64 lowercase hex digits)"),
        (["x-00001-of-00002.npy"], " is a list, not an object"),  # not an entry at all
    ],
)
def test_manifest_refuses_malformed_file_entries(tmp_path, change, problem):
    files.split({"x": np.zeros((10, 2), "float32")}, tmp_path, 2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    shard_files = manifest["shards"][1]["files"]
    if isinstance(change, dict):
        for key, value in change.items():
            if value is _MISSING:
                del shard_files["x"][key]
            else:
                shard_files["x"][key] = value
    else:
        shard_files["x"] = change
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as info:
        files.manifest(tmp_path)
    where = "shards[1].files['x']" + ("." if not problem.startswith(" ") else "")
    assert str(info.value) == (
        "The manifest must be one written by `shardfeed split` (format 'shardfeed.split', "
        f"version 1). Received: {tmp_path / 'manifest.json'}: {where}{problem}. Split the data "
        "again with `shardfeed split`, or pass the manifest's path."
    )


def test_manifest_refuses_a_row_shape_larger_than_its_files(tmp_path):
    files.split({"x": np.zeros((10, 2), "float32")}, tmp_path, 2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["arrays"]["x"]["row_shape"] = [2**40, 2**40]  # 2**80 elements: wraps in int64
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as info:
        files.manifest(tmp_path)
    assert f"shards[0].files['x'].bytes=168 is less than its 5 rows of <f4[{2**40}, {2**40}] " in (
        str(info.value)
    )


def test_split_parquet_pages_carry_checksums(tmp_path):
    files.split({"x": np.arange(1000, dtype="float64")}, tmp_path, 2, "parquet")
    shard = tmp_path / "x-00000-of-00002.parquet"
    chunk = pq.ParquetFile(shard).metadata.row_group(0).column(0)
    raw = bytearray(shard.read_bytes())
    # A byte near the end of the column chunk: inside the last page's (compressed) values.
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    raw[start + chunk.total_compressed_size - 10] ^= 0x01
    shard.write_bytes(bytes(raw))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    leaf = files.manifest(tmp_path, verify=False)["x"]  # the sha256 would catch it first
    with pytest.raises(ValueError) as info:
        leaf[0:10]
    assert str(info.value).startswith(
        "Every page of a Parquet column must decode and match its page checksum (when the "
        f"writer stored one). Received: {shard}['x'] row group 0: OSError: could not verify "
        "page integrity, CRC checksum verification failed"
    ), str(info.value)
    assert manifest["shards"][0]["files"]["x"]["path"] == shard.name


def test_manifest_refuses_other_formats(tmp_path):
    (tmp_path / "manifest.json").write_text(
        json.dumps({"format": "shardfeed.split", "format_version": 2})
    )
    with pytest.raises(ValueError) as info:
        files.manifest(tmp_path)
    assert str(info.value) == (
        "The manifest must be one written by `shardfeed split` (format 'shardfeed.split', "
        f"version 1). Received: {tmp_path / 'manifest.json'}: format_version=2 (this reader: "
        "1). Split the data again with `shardfeed split`, or pass the manifest's path."
    )
    with pytest.raises(FileNotFoundError, match=r"manifest must exist\. Received: path="):
        files.manifest(tmp_path / "elsewhere")


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (
            {"arrays": {"x": np.zeros(5), "y": np.zeros(4)}},
            ValueError,
            r"same number of rows\. Received: x has 5, y has 4\.",
        ),
        (
            {"num_shards": 6},
            ValueError,
            r"at least one row\. Received: num_shards=6, num_rows=5\.",
        ),  # a shard would be empty
        ({"num_shards": 0}, ValueError, r"`num_shards` must be an integer >= 1\."),
        ({"format": "csv"}, ValueError, r"`format` must be one of \('npy', 'parquet'\)\."),
        ({"arrays": {"../x": np.zeros(5)}}, ValueError, r"Received: name='\.\./x'\."),
        (
            {"arrays": {"x": np.array(["a"] * 5)}},
            TypeError,
            r"must be numeric \(bool, integer, float or complex\)\. "
            r"Received: arrays\['x'\]\.dtype=<U1\. .* before splitting\.",
        ),
        (
            {"arrays": {"x": np.array([object()] * 5)}},
            TypeError,
            r"Object \(pickled\) arrays cannot be uploaded to a device: .* "
            r"Received: arrays\['x'\]\.dtype=object\. .* before splitting\.",
        ),  # the same rules as the dataset's, one validator
        (
            {"arrays": {"x": np.zeros(())}},
            ValueError,
            r"Each array needs a leading row dimension\. Received: arrays\['x'\]\.shape=\(\)\.",
        ),
        (
            {"arrays": {"x": np.zeros(5, "complex64")}, "format": "parquet"},
            TypeError,
            r"Parquet has no complex type\.",
        ),
        ({"arrays": {"x": [1, 2, 3, 4, 5]}}, TypeError, r"Received: type\(arrays\['x'\]\)=list\."),
        ({"chunk_bytes": 0}, ValueError, r"`chunk_bytes` must be a positive integer\."),
    ],
)
def test_split_refuses_bad_input(tmp_path, kwargs, error, pattern):
    call = {"arrays": {"x": np.zeros(5)}, "out_dir": tmp_path, "num_shards": 2, **kwargs}
    with pytest.raises(error, match=pattern):
        files.split(**call)
    assert not (tmp_path / "manifest.json").exists()


def test_split_refuses_to_overwrite_unless_asked(tmp_path):
    files.split({"x": np.zeros(5)}, tmp_path, 2)
    with pytest.raises(
        FileExistsError, match=r"already holds a split dataset\. Received: out_dir="
    ):
        files.split({"x": np.ones(5)}, tmp_path, 2)
    files.split({"x": np.ones(5)}, tmp_path, 2, overwrite=True)
    np.testing.assert_array_equal(files.manifest(tmp_path)["x"][:], np.ones(5))


def test_cli_split(tmp_path, capsys):
    arrays = _arrays()
    np.save(tmp_path / "x.npy", arrays["x"])
    np.savez(tmp_path / "d.npz", y=arrays["y"])
    out = tmp_path / "out"
    argv = ["split", "--num-shards", "3", "--out", str(out), "--format", "parquet"]
    assert _cli.main([*argv, f"x={tmp_path / 'x.npy'}", f"y={tmp_path / 'd.npz'}:y"]) == 0
    assert f"wrote 103 rows of x, y as 3 shard(s) of parquet files; manifest: {out}" in (
        capsys.readouterr().out
    )
    leaves = files.manifest(out)
    np.testing.assert_array_equal(leaves["x"][30:80], arrays["x"][30:80])
    np.testing.assert_array_equal(leaves["y"][:], arrays["y"])


def test_cli_split_reports_bad_input(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    _split.add_arguments(parser)
    for inputs, expected in [
        (["x"], "Each input must be written `name=path`. Received: input='x'."),
        (["x=a.csv"], "An input must be a .npy file, or `file.npz:key`"),
        ([f"x={tmp_path / 'none.npy'}"], "The data file must exist"),
    ]:
        args = parser.parse_args(["--num-shards", "2", "--out", str(tmp_path), *inputs])
        assert _split.run(args) == 2
        assert expected in capsys.readouterr().err


def test_dataset_from_manifest_predicts_like_the_arrays(tmp_path):
    arrays = _arrays()
    files.split({"x": arrays["x"].reshape(ROWS, 8), "y": arrays["y"]}, tmp_path, 3)
    leaves = files.manifest(tmp_path)
    dataset = shardfeed.ShardedResidentDataset(
        x=leaves["x"],
        y=leaves["y"],
        per_replica_batch_size=16,
        shuffle=False,
        load_options=shardfeed.LoadOptions(chunk_bytes=256),  # 8 rows per chunk
    )
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    np.testing.assert_allclose(
        shardfeed.predict(model, dataset), model(arrays["x"].reshape(ROWS, 8)).numpy(), atol=1e-6
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_rows", 10.9),  # int() truncated it and 1000.9 rows passed
        ("num_rows", True),
        ("row_start", 5.0),
        ("row_stop", "10"),
        ("row_shape", 2.5),
    ],
)
def test_manifest_counts_must_be_json_integers(tmp_path, field, value):
    files.split({"x": np.zeros((10, 2), "float32")}, tmp_path, 2)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    if field == "num_rows":
        manifest["num_rows"], where = value, "num_rows"
    elif field == "row_shape":
        manifest["arrays"]["x"]["row_shape"], where = [value], "arrays['x'].row_shape[0]"
    else:
        manifest["shards"][1][field], where = value, f"shards[1].{field}"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as info:
        files.manifest(tmp_path)
    assert str(info.value) == (
        "The manifest must be one written by `shardfeed split` (format 'shardfeed.split', "
        f"version 1). Received: {tmp_path / 'manifest.json'}: {where}={value!r} (needs an "
        "integer). Split the data again with `shardfeed split`, or pass the manifest's path."
    )


@pytest.mark.parametrize("file_format", ["npy", "parquet"])
@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("swap", ["symlink", "replaced", "fifo"])
@pytest.mark.timeout(60)  # a FIFO blocked the open forever
def test_a_shard_file_swapped_after_the_manifest_was_read_is_refused(
    tmp_path, file_format, verify, swap
):
    """The check-then-open race: a shard swapped for a symlink to an outside
    file (or for another file) after `files.manifest()` returned was followed;
    one swapped for a FIFO hung the read."""
    split_dir, outside = tmp_path / "split", tmp_path / "outside"
    x = np.zeros((10, 2), "float32")
    files.split({"x": x}, split_dir, 2, file_format)
    outside.mkdir()
    name = f"x-00000-of-00002.{file_format}"
    # The outside file is a valid shard of other numbers, of the very same size.
    files.split({"x": np.full_like(x, 7.0)}, outside, 2, file_format)
    leaves = files.manifest(split_dir, verify=verify)
    shard = split_dir / name
    shard.unlink()
    if swap == "symlink":
        shard.symlink_to(outside / name)
        problem = "is a symbolic link, not a regular file"
    elif swap == "fifo":
        os.mkfifo(shard)
        problem = "is a FIFO (named pipe), not a regular file"
    else:
        (outside / name).rename(shard)
        problem = "(device, inode)=("
    with pytest.raises(ValueError) as info:
        leaves["x"][0:5]
    message = str(info.value)
    assert message.startswith(
        "A shard file must be the file `files.manifest()` checked: it is opened without "
        "following links, and must be the same file (device and inode). Received: "
        f"{shard} {problem}"
    )
    assert message.endswith(
        "The split directory changed after the manifest was read (a file was replaced, or "
        "swapped for a symlink); copy it again, then call `files.manifest()` again."
    )
    assert "sha256" not in message


def test_a_manifest_leaf_reads_only_the_file_it_opened(tmp_path):
    """Rows come from the checked open file: renaming another file over the
    path after the first read changes nothing that is read."""
    x = np.arange(20, dtype="float32").reshape(10, 2)
    files.split({"x": x}, tmp_path / "split", 1)
    leaf = files.manifest(tmp_path / "split")["x"]
    np.testing.assert_array_equal(leaf[0:2], x[0:2])
    other = tmp_path / "other.npy"
    np.save(other, np.full_like(x, 7.0))
    other.rename(tmp_path / "split" / "x-00000-of-00001.npy")
    np.testing.assert_array_equal(leaf[2:10], x[2:10])
