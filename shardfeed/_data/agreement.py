"""Every worker was given the same rows and dataset settings: `check_agreement`.

Called while a dataset is built, before any upload: each worker sends its row
count, each column's name, row shape and dtype, and a hash of the same few
seeded rows, with `dataset_settings`, in one `all_gather_bytes`; a mismatch
raises on every rank. Why: an unseeded shuffle before building the dataset
gives each rank other rows and trains wrong without a word.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._common.agreement import plain
from shardfeed._common.fingerprint import function_fingerprint as function_fingerprint
from shardfeed._common.world import WorldLike
from shardfeed._data.sources import Columns

# Rows hashed per column: 16 rows of 1,000 are enough to see a permutation
# (the chance that all 16 land on fixed points is negligible), and reading
# them costs 16 small reads however large the rows are.
SAMPLE_ROWS = 16
# Fixed, so every worker (and every run) samples the same rows for a row count.
_SEED = 0x5F3759DF

# How a source's rows may be read for the fingerprint (`agreement_rows`).
RowAccess = Literal["any", "leading", "none"]

_FIX = (
    "Give every worker the same full dataset in the same order: seed the shuffle "
    "or split before building it (e.g. `np.random.default_rng(0).permutation(n)`, "
    "`df.sample(frac=1, random_state=0)`), or read the same files on every worker; "
    "shardfeed itself shards the rows across workers. To skip this check, pass "
    "`load_options=LoadOptions(check_agreement=False)`."
)


def sample_rows(num_rows: int, access: RowAccess = "any") -> list[int]:
    """The global rows each worker hashes: the same on every worker for a row count."""
    count = min(SAMPLE_ROWS, num_rows)
    if access == "none" or count == 0:
        return []
    if access == "leading":
        return list(range(count))
    rng = np.random.default_rng([_SEED, num_rows])
    return sorted(int(i) for i in rng.choice(num_rows, size=count, replace=False))


def _access(leaf: Any) -> RowAccess:
    """How cheaply `leaf`'s rows can be read; a concatenation of files as its
    most restrictive part (its first rows are its first parts' first rows)."""
    parts = getattr(leaf, "parts", None)
    if isinstance(parts, list | tuple) and parts:
        accesses = {_access(p) for p in parts}
        return "none" if "none" in accesses else "leading" if "leading" in accesses else "any"
    declared = getattr(leaf, "agreement_rows", "any")
    return "leading" if declared == "leading" else "none" if declared == "none" else "any"


def _row_hash(rows: np.ndarray) -> str:
    # Not a security check: SHA-1 over the array's own buffer (no copy) was the
    # fastest of hashlib's digests here (about 2x BLAKE2b on 1 MiB rows).
    buffer = rows.reshape(-1).view(np.uint8).data
    return hashlib.sha1(buffer, usedforsecurity=False).hexdigest()[:16]


def fingerprint(columns: Columns) -> dict[str, Any]:
    """What this worker compares: row count, columns and the sampled rows' hashes."""
    described = []
    for column in columns.columns:
        rows = sample_rows(columns.num_rows, _access(column.data))
        described.append(
            {
                "name": column.name,
                "shape": list(column.row_shape),
                "dtype": column.dtype.str,
                "rows": rows,
                "hashes": [_row_hash(column.read(i, i + 1)) for i in rows],
            }
        )
    return {"num_rows": columns.num_rows, "columns": described}


_SETTINGS_FIX = (
    "Pass the same dataset arguments on every worker (e.g. read them from one "
    "config, or seed from a constant rather than the rank or the clock): they "
    "decide which rows each step takes and which collectives every rank runs."
)


def dataset_settings(
    *,
    per_replica_batch_size: int,
    drop_remainder: bool,
    placement: str,
    shuffle: bool | str,
    seed: int | None,
    options: Any,
    transform: Any = None,
    augment: Any = None,
) -> dict[str, Any]:
    """The dataset arguments every rank must share, as the ranks compare them:
    ranks that differ take other rows per step (a different `seed` with
    `placement="replicate"` trained some rows twice and others never, rc 0), or
    run other collectives and crash or hang (batch size, `drop_remainder`,
    `shuffle`, `placement`, the exchange's and the streaming's sizes).
    `LoadOptions` about this host's memory and upload may differ. The
    `transform` and `augment` are compared by `function_fingerprint`."""
    shared = (
        "streaming",
        "stream_chunk_bytes",
        "exchange_fraction",
        "exchange_buffer_bytes",
        "epoch_copy",
    )
    given = {
        "per_replica_batch_size": per_replica_batch_size,
        "drop_remainder": drop_remainder,
        "placement": placement,
        "shuffle": shuffle,
        "seed": seed,
        **{f"LoadOptions.{name}": getattr(options, name) for name in shared},
        "transform": function_fingerprint(transform),
        "augment": function_fingerprint(augment),
    }
    return {name: plain(value) for name, value in given.items()}


def check_agreement(
    columns: Columns, world: WorldLike, settings: dict[str, Any] | None = None
) -> None:
    """Raises on every worker when the workers' datasets differ.

    Call it on every worker at the same point (it is a collective). An error
    while reading this worker's sampled rows is sent along and raised on
    every rank too.

    Args:
        columns: This worker's rows.
        world: The workers.
        settings: This worker's `dataset_settings` (compared first).

    Raises:
        ValueError: Naming the ranks and what differs (a setting, the row
            count, a column's name, shape or dtype, or sampled rows), with the fix.
    """
    if world.world_size == 1:
        return
    try:
        mine: dict[str, Any] = fingerprint(columns)
    except Exception as err:  # sent to every rank, re-raised below
        mine = {"error": f"{type(err).__name__}: {err}"}
    mine["settings"] = settings or {}
    gathered = world.all_gather_bytes(json.dumps(mine).encode())
    prints = [json.loads(p) for p in gathered]
    for rank, theirs in enumerate(prints):
        if "error" in theirs:
            raise ValueError(
                _errors.message(
                    "Every worker reads a few rows of its dataset to check that all "
                    "workers hold the same data; one could not.",
                    f"rank {rank}: {theirs['error']}",
                    "Fix that worker's input (the error names it).",
                )
            )
    setting = _first_setting_difference(prints)
    if setting is not None:
        raise ValueError(
            _errors.message(
                "Every worker must build the dataset with the same arguments.",
                setting,
                _SETTINGS_FIX,
            )
        )
    difference = _first_difference(prints)
    if difference is not None:
        raise ValueError(
            _errors.message(
                "Every worker must build the dataset from the same rows in the same "
                "order (each then uploads its own shard).",
                difference,
                _FIX,
            )
        )


def _first_setting_difference(prints: list[dict[str, Any]]) -> str | None:
    chief = prints[0].get("settings", {})
    for rank, theirs in enumerate(prints[1:], start=1):
        mine = theirs.get("settings", {})
        for name in sorted(set(chief) | set(mine)):
            if chief.get(name) != mine.get(name):
                return f"rank {rank} has {name}={mine.get(name)!r}, rank 0 has {chief.get(name)!r}"
    return None


def _first_difference(prints: list[dict[str, Any]]) -> str | None:
    chief = prints[0]
    for rank, theirs in enumerate(prints[1:], start=1):
        if theirs["num_rows"] != chief["num_rows"]:
            return f"rank {rank} has {theirs['num_rows']} rows, rank 0 has {chief['num_rows']}"
        names = [c["name"] for c in theirs["columns"]]
        chief_names = [c["name"] for c in chief["columns"]]
        if names != chief_names:
            return (
                f"rank {rank} has columns {', '.join(names)}, rank 0 has {', '.join(chief_names)}"
            )
        for mine, other in zip(chief["columns"], theirs["columns"], strict=True):
            name = mine["name"]
            for field in ("shape", "dtype"):
                if mine[field] != other[field]:
                    return (
                        f"column {name}: rank {rank} has row {field} {other[field]}, "
                        f"rank 0 has {mine[field]}"
                    )
            differ = [
                row
                for row, a, b in zip(mine["rows"], mine["hashes"], other["hashes"], strict=True)
                if a != b
            ]
            if differ:
                listed = ", ".join(str(r) for r in differ[:6])
                listed += ", ..." if len(differ) > 6 else ""
                return (
                    f"column {name}: rows {listed} differ between ranks 0 and {rank} "
                    f"({len(differ)} of the {len(mine['rows'])} rows compared): the arrays "
                    "were shuffled or loaded differently per rank"
                )
    return None
