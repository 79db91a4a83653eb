"""Every rank's model starts from rank 0's values: `sync_model`'s neutral part.

Owns making a model's variables identical across workers for a user's own
loop, on both backends (the world is anything with `rank`, `world_size` and
`all_gather_bytes`). `shardfeed.fit` does this itself (TensorFlow's engines
at the start of `fit`, JAX's `Loop.broadcast_from_chief`); a loop of the
user's never hands the model to shardfeed, and on JAX an unseeded model
starts from other random values on each process, which a jitted step over
the global batch does not reconcile (each process steps its own copy), so
the ranks end with other weights. Each rank sends a fingerprint (each
variable's path, shape, dtype and a hash of its bytes) in one small
all-gather; only when the values differ does rank 0 send them, in a second.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

import keras
import numpy as np

from shardfeed._common import errors as _errors


class _World(Protocol):
    @property
    def world_size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    def all_gather_bytes(self, payload: bytes, /) -> list[bytes]: ...


def model_variables(model: keras.Model) -> list[Any]:
    """What a loop steps: the trainable and non-trainable variables (seed
    generators' states among them), and the compiled optimizer's once built."""
    variables = [*model.trainable_variables, *model.non_trainable_variables]
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
        variables += optimizer.variables
    return variables


def _fingerprint(values: list[np.ndarray], variables: list[Any]) -> list[list[Any]]:
    # Not a security check: a digest of each value's bytes, to compare.
    return [
        [
            getattr(v, "path", getattr(v, "name", "")),
            list(value.shape),
            value.dtype.str,
            hashlib.sha1(value.tobytes(), usedforsecurity=False).hexdigest(),
        ]
        for v, value in zip(variables, values, strict=True)
    ]


def sync_variables(world: _World, variables: list[Any]) -> int:
    """Gives every worker rank 0's values of `variables`; returns how many
    differed on some rank (0: nothing was sent but the fingerprints).

    A collective: call it on every worker at the same point.

    Raises:
        ValueError: When the workers' models differ in their variables
            (count, path, shape or dtype), naming the first difference.
    """
    if world.world_size == 1:
        return 0
    values = [np.ascontiguousarray(np.asarray(v.value)) for v in variables]
    mine = _fingerprint(values, variables)
    prints = [json.loads(p) for p in world.all_gather_bytes(json.dumps(mine).encode())]
    _check_structure(prints)
    differ = [i for i in range(len(mine)) if any(p[i][3] != prints[0][i][3] for p in prints)]
    if not differ:
        return 0
    payload = b"".join(values[i].tobytes() for i in differ) if world.rank == 0 else b""
    chief = world.all_gather_bytes(payload)[0]
    offset = 0
    for i in differ:
        size = values[i].nbytes
        value = np.frombuffer(chief, values[i].dtype, values[i].size, offset)
        variables[i].assign(value.reshape(values[i].shape))
        offset += size
    return len(differ)


def _check_structure(prints: list[list[list[Any]]]) -> None:
    chief = prints[0]
    for rank, theirs in enumerate(prints[1:], start=1):
        difference = None
        if len(theirs) != len(chief):
            difference = f"rank {rank} has {len(theirs)} variables, rank 0 has {len(chief)}"
        else:
            for (path, shape, dtype, _), (p0, s0, d0, _) in zip(theirs, chief, strict=True):
                if (path, shape, dtype) != (p0, s0, d0):
                    difference = (
                        f"rank {rank} has variable {path} {shape} {dtype}, "
                        f"rank 0 has {p0} {s0} {d0}"
                    )
                    break
        if difference is not None:
            raise ValueError(
                _errors.message(
                    "Every worker must build the same model (the same layers, in the same "
                    "order, built on inputs of the same shapes) before its weights can be "
                    "made identical.",
                    difference,
                    "Build the model from the same code and input shapes on every worker, "
                    "and build it (and its optimizer) before `sync_model`.",
                )
            )
