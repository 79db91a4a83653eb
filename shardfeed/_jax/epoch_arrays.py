"""`EpochArrays`: one epoch's device data, the pytree a compiled call takes, refused once
its epoch is closed (its buffers may then be reused or deleted, which JAX does not
check before running a call)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from shardfeed._common import errors as _errors


class _Fields(NamedTuple):
    columns: tuple[jax.Array, ...]
    epoch: jax.Array
    positions: jax.Array | None = None
    first_step: jax.Array | None = None
    full_steps: jax.Array | None = None


CLOSED_ARRAYS = (
    "A closed epoch's `arrays` cannot go into a compiled call or `batch_fn`: `close()` "
    "let go of their device data (the dataset writes a later epoch's rows into it, or "
    "moved its rows in place), so they may hold deleted buffers."
)


class EpochArrays(_Fields):
    """One epoch's device data (a pytree of `jax.Array`s, passed to `batch_fn`).

    Attributes:
        columns: Per column, sharded along rows: the resident rows (each
            replica's buffer), or with `positions` None, the epoch's copy
            `[num_replicas * steps * per_replica_batch_size, ...]` (each
            replica's rows in step order).
        epoch: The epoch number (int32, replicated): `augment`'s key reads it.
        positions: `[num_replicas * steps * per_replica_batch_size]` int32
            sharded along rows: each replica's positions in its own buffer of
            its rows in step order (padding: 0); None for a copy.
        first_step: For a streamed epoch's chunk (`streaming.py`), the step
            its copy starts at (int32, replicated); None: the copy starts at
            step 0.
        full_steps: The epoch's full steps (int32, replicated): `batch_fn`
            refuses a step outside `[0, full_steps)`; None: unchecked.

    Once its epoch is closed, flattening it (as `jax.jit` does with every
    argument) raises: JAX does not check for deleted buffers before running
    a call (it raised "Buffer has been deleted or donated" on 1-3 CPU
    devices, and killed the process with SIGSEGV on 2-3 devices in issue
    26's custom loop).
    """

    # The epoch that closed these arrays (`ResidentEpoch.close`); None: open.
    # An instance attribute, not a field: a traced copy is never closed.
    _closed_by: str | None = None

    def close(self, epoch: str) -> None:
        """Refuses these arrays from now on, naming `epoch`."""
        self._closed_by = epoch

    def check_open(self) -> None:
        if self._closed_by is not None:
            raise RuntimeError(
                _errors.message(
                    CLOSED_ARRAYS,
                    f"EpochArrays of {self._closed_by} (closed)",
                    "Pass `epoch.arrays` (a streamed epoch's `epoch.call_arrays(start, stop)`) "
                    "of an open epoch to each call: `dataset.epoch(n)`, or the epoch "
                    "`iterator.epochs()` is on now.",
                )
            )


def _flatten(arrays: EpochArrays) -> tuple[tuple[Any, ...], None]:
    arrays.check_open()
    return tuple(arrays), None


def _flatten_with_keys(arrays: EpochArrays) -> tuple[tuple[Any, ...], None]:
    arrays.check_open()
    keys = (jax.tree_util.GetAttrKey(name) for name in _Fields._fields)
    return tuple(zip(keys, arrays, strict=True)), None


jax.tree_util.register_pytree_with_keys(
    EpochArrays, _flatten_with_keys, lambda _, children: EpochArrays(*children), _flatten
)
