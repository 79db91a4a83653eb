"""A model's variables made identical across ranks, or checked to be: `sync_model`'s neutral part,
and the one rule every in-sync check applies (`Divergence`).

Each rank sends a fingerprint (each variable's path, shape, dtype and a hash of
its bytes) in one small all-gather; only when they differ does rank 0 send the
values. Used by both backends' `sync_model`, JAX's `save_model`, `evaluate` and
`predict`, and both datasets' `iterator(model=)`; TensorFlow's `fit` sync check
(`_tf/sync.py`, per replica, from checksums on the devices) applies the same
`Divergence`. Reads the model by duck typing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._common.world import WorldLike


def model_variables(model: Any) -> list[Any]:
    """What a loop steps: a Keras model's trainable and non-trainable
    variables (seed generators' states among them), and the compiled
    optimizer's once built.

    Raises:
        TypeError: For anything without a model's variables (was a raw
            `AttributeError` from inside the check).
    """
    if not all(hasattr(model, a) for a in ("trainable_variables", "non_trainable_variables")):
        raise TypeError(
            _errors.message(
                "`model` must be a Keras model: its variables are compared across workers.",
                f"type(model)={type(model).__name__}",
                "Pass the `keras.Model` your loop trains.",
            )
        )
    variables = [*model.trainable_variables, *model.non_trainable_variables]
    optimizer: Any = getattr(model, "optimizer", None)
    # A compiled Keras optimizer (`model.optimizer` may be None or a string
    # before `compile`).
    if getattr(optimizer, "built", False) and hasattr(optimizer, "variables"):
        variables += optimizer.variables
    return variables


def _host_values(variables: list[Any]) -> list[np.ndarray | None]:
    """Each variable's value on this host; None for one sharded across
    processes (a `keras.distribution` layout: no host holds it whole, and it
    is one array, not a copy per rank that could differ)."""
    values: list[np.ndarray | None] = []
    for v in variables:
        value = v.value
        spread = not getattr(value, "is_fully_addressable", True)
        if spread and not getattr(value, "is_fully_replicated", False):
            values.append(None)
        else:
            values.append(np.ascontiguousarray(np.asarray(value)))
    return values


def _fingerprint(values: list[np.ndarray | None], variables: list[Any]) -> list[list[Any]]:
    # Not a security check: a digest of each value's bytes, to compare.
    return [
        [
            getattr(v, "path", getattr(v, "name", "")),
            list(v.shape),
            np.dtype(value.dtype if value is not None else "V1").str,
            hashlib.sha1(value.tobytes(), usedforsecurity=False).hexdigest()
            if value is not None
            else "sharded",
        ]
        for v, value in zip(variables, values, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where holders (ranks, or replicas) hold other values than holder 0.

    The rule of every in-sync check: holder `h` differs in variable `i` when
    its fingerprint of `i` is not holder 0's; the check names the first
    variable that differs on any holder, every holder that differs in it, and
    how many variables differ on any holder.

    Attributes:
        variable: The first variable that differs on some holder.
        holders: The holders whose `variable` differs from holder 0's.
        count: Variables that differ on some holder.
        total: Variables compared.
    """

    variable: int
    holders: tuple[int, ...]
    count: int
    total: int

    @classmethod
    def of(cls, prints: Sequence[Sequence[Hashable]]) -> Divergence | None:
        """The divergence of `prints` (per holder, one fingerprint per
        variable, in the same order on every holder), or None when all agree.

        Example:
            >>> Divergence.of([["a", "b"], ["a", "b"], ["x", "b"]])
            Divergence(variable=0, holders=(2,), count=1, total=2)
        """
        diverged = diverged_variables(prints)
        if not diverged:
            return None
        first = diverged[0]
        holders = tuple(h for h, p in enumerate(prints) if p[first] != prints[0][first])
        return cls(first, holders, len(diverged), len(prints[0]))

    def received(self, name: str, holder: str, variables: str = "variables") -> str:
        """The `Received:` part of a check's message: `name` the variable's,
        `holder` "rank" or "replica", `variables` what was compared."""
        return (
            f"variable {name} differs on {holder}s {list(self.holders)} from {holder} 0 "
            f"({self.count} of {self.total} {variables} differ)"
        )


def diverged_variables(prints: Sequence[Sequence[Hashable]]) -> list[int]:
    """The variables whose fingerprint differs from holder 0's on some holder."""
    return [i for i in range(len(prints[0])) if any(p[i] != prints[0][i] for p in prints)]


_OUT_OF_SYNC_FIX = (
    "Call `shardfeed.sync_model(model)` on every worker after building the model and "
    "its optimizer and before your loop's first step (or seed Keras alike on every "
    "worker: `keras.utils.set_random_seed(0)` before building); `shardfeed.fit` does "
    "this itself."
)


def check_in_sync(world: WorldLike, variables: list[Any], action: str) -> None:
    """Raises on every worker when the workers' `variables` differ (one small
    all-gather of fingerprints), before `action` would use rank 0's alone.

    Raises:
        ValueError: Naming the first variable that differs, with the fix.
    """
    if world.world_size == 1:
        return
    mine = _fingerprint(_host_values(variables), variables)
    prints = [json.loads(p) for p in world.all_gather_bytes(json.dumps(mine).encode())]
    _check_structure(prints)
    divergence = Divergence.of([[v[3] for v in p] for p in prints])
    if divergence is not None:
        raise ValueError(
            _errors.message(
                f"Every worker must hold the same weights to {action}: the workers "
                "trained one model only if they started from the same values.",
                divergence.received(mine[divergence.variable][0], "rank"),
                _OUT_OF_SYNC_FIX,
            )
        )


def sync_variables(world: WorldLike, variables: list[Any]) -> int:
    """Gives every worker rank 0's values of `variables`; returns how many
    differed on some rank (0: nothing was sent but the fingerprints).

    A collective: call it on every worker at the same point.

    Raises:
        ValueError: When the workers' models differ in their variables
            (count, path, shape or dtype), naming the first difference.
    """
    if world.world_size == 1:
        return 0
    values = _host_values(variables)
    mine = _fingerprint(values, variables)
    prints = [json.loads(p) for p in world.all_gather_bytes(json.dumps(mine).encode())]
    _check_structure(prints)
    differ = diverged_variables([[v[3] for v in p] for p in prints])
    if not differ:
        return 0
    local = [values[i] for i in differ]
    present = [value for value in local if value is not None]  # "sharded" never differs
    payload = b"".join(value.tobytes() for value in present) if world.rank == 0 else b""
    chief = world.all_gather_bytes(payload)[0]
    offset = 0
    for i, value in zip(differ, local, strict=True):
        assert value is not None, "a sharded value's fingerprint is the same on every rank"
        copied = np.frombuffer(chief, value.dtype, value.size, offset)
        variables[i].assign(copied.reshape(value.shape))
        offset += value.nbytes
    return len(differ)


def _check_structure(prints: list[list[list[Any]]]) -> None:
    chief = prints[0]
    for rank, theirs in enumerate(prints[1:], start=1):
        difference = None
        if len(theirs) != len(chief):
            difference = f"rank {rank} has {len(theirs)} variables, rank 0 has {len(chief)}"
        else:
            for (path, shape, dtype, _), (p0, s0, d0, _) in zip(theirs, chief, strict=True):
                if (_generic(path), shape, dtype) != (_generic(p0), s0, d0):
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


def _generic(path: str) -> str:
    """`path` without the numbers Keras appends to generated names: the same
    model built twice on a rank (`sequential_1/dense_2/kernel`, its optimizer's
    `adam/sequential_1_dense_2_kernel_momentum`) is the same structure as
    `sequential/dense/kernel` elsewhere. Order, shapes and dtypes still count."""
    return _NUMBERED.sub("", path)


_NUMBERED = re.compile(r"_\d+(?=[/_]|$)")
