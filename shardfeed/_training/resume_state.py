"""The resume state's file form (`ResumeState`), checked field by field.

What a checkpoint adds to the weights (cursor, the data's seed and shape, the
world shape, running loss and metric values), each field's type and range,
errors naming the file and field; and `epoch_span`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors

# 2: `order` added (the epoch order's name). Format 1 states, written before
# both backends shared one order, are read with `order=None`.
FORMAT = 2
_FORMATS = (1, 2)


@dataclasses.dataclass
class Cursor:
    """Where training stands: fit epoch `epoch` with `step` of its steps done,
    inside pass `data_epoch` over the data (which seeds the order) with
    `data_step` of that pass's steps done. Without `steps_per_epoch` a fit
    epoch is one pass, and the two pairs are equal."""

    epoch: int
    step: int
    data_epoch: int
    data_step: int


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """What a checkpoint adds to the model's weights: a few integers and the
    running epoch logs.

    Attributes:
        cursor: Where training stood (see `Cursor`).
        seed, shuffle, placement, num_rows: The data's order and size; a resume
            must use the same.
        num_replicas, global_batch_size: The world shape it was written with.
        steps_per_epoch: `fit`'s `steps_per_epoch` (None: one pass per epoch).
        order: The name of the epoch order it trained (the dataset's
            `order_name`); None: a format 1 state, written before both
            backends shared one order (TensorFlow's was another).
        loss_sum, loss_rows: The epoch's running loss (sum over rows, rows).
        metrics: The values of the model's metric variables (global values),
            so an epoch's logs after a resume cover the whole epoch.
    """

    cursor: Cursor
    seed: int | None
    shuffle: bool | str
    placement: str
    num_rows: int
    num_replicas: int
    global_batch_size: int
    steps_per_epoch: int | None
    loss_sum: float
    loss_rows: int
    metrics: list[Any]
    order: str | None = None

    # Where the state was read from (named in errors); not part of the file.
    source: str = dataclasses.field(default="the resume state", compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["source"]
        out["format"] = FORMAT
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "the resume state") -> ResumeState:
        """The state in `data` (`to_dict`'s form), each field checked for its
        type and range (`adapt` and `check_run` then check it against the
        dataset and the run).

        Raises:
            ValueError: Naming `source` and the field, for a wrong format
                version, a missing or unknown field, or a value of the wrong
                type or out of range.
        """
        where = "state"
        if not isinstance(data, dict):
            raise state_error(source, "`state` must be a JSON object", f"{where}={shortened(data)}")
        version = data.get("format")
        if not any(version == v and type(version) is int for v in _FORMATS):
            raise ValueError(
                _errors.message(
                    f"A shardfeed resume state must have format {' or '.join(map(str, _FORMATS))}.",
                    f"{source}: {where}.format={shortened(version)}",
                    "Resume with the shardfeed version that wrote it, or start afresh.",
                )
            )
        fields = set(_FIELDS) if version == FORMAT else set(_FIELDS) - {"order"}
        _check_fields(source, where, data, {*fields, "format"})
        if version == FORMAT and not isinstance(data["order"], str):
            raise state_error(
                source,
                "`order` must be the name of an epoch order (a string)",
                f"{where}.order={shortened(data['order'])}",
            )
        cursor = data["cursor"]
        if not isinstance(cursor, dict):
            raise state_error(
                source, "`cursor` must be a JSON object", f"{where}.cursor={shortened(cursor)}"
            )
        _check_fields(source, f"{where}.cursor", cursor, set(_CURSOR_FIELDS))
        for name in _CURSOR_FIELDS:
            _count(source, f"{where}.cursor.{name}", cursor[name], 0)
        _count(source, f"{where}.num_rows", data["num_rows"], 1)
        num_replicas = _count(source, f"{where}.num_replicas", data["num_replicas"], 1)
        global_batch = _count(source, f"{where}.global_batch_size", data["global_batch_size"], 1)
        if global_batch % num_replicas:
            raise state_error(
                source,
                "`global_batch_size` must be a multiple of `num_replicas` (replicas x "
                "per-replica batch)",
                f"{where}.global_batch_size={global_batch}, {where}.num_replicas={num_replicas}",
            )
        if data["steps_per_epoch"] is not None:
            _count(source, f"{where}.steps_per_epoch", data["steps_per_epoch"], 1)
        if data["seed"] is not None:
            _count(source, f"{where}.seed", data["seed"], 0)
        shuffle = data["shuffle"]
        if not (shuffle is True or shuffle is False or shuffle == "local"):
            raise state_error(
                source,
                '`shuffle` must be true, false or "local"',
                f"{where}.shuffle={shortened(shuffle)}",
            )
        if data["placement"] not in ("replicate", "shard"):
            raise state_error(
                source,
                '`placement` must be "replicate" or "shard"',
                f"{where}.placement={shortened(data['placement'])}",
            )
        loss_rows = _count(source, f"{where}.loss_rows", data["loss_rows"], 0)
        loss_sum = data["loss_sum"]
        if not _is_number(loss_sum) or not _is_finite(loss_sum):
            raise state_error(
                source,
                "`loss_sum` must be a finite number (the epoch's running loss: a run whose "
                "loss was not finite cannot be continued)",
                f"{where}.loss_sum={shortened(loss_sum)}",
            )
        if loss_rows == 0 and loss_sum != 0:
            raise state_error(
                source,
                "`loss_sum` must be 0 when no rows were counted (`loss_rows=0`)",
                f"{where}.loss_sum={loss_sum!r}, {where}.loss_rows=0",
            )
        # A loss is a mean of per-row losses; none is above float32's largest value.
        if abs(loss_sum) > loss_rows * _LARGEST_ROW_LOSS:
            raise state_error(
                source,
                f"`loss_sum` must be at most float32's largest value ({_LARGEST_ROW_LOSS:.3g}) "
                "per counted row in magnitude",
                f"{where}.loss_sum={loss_sum!r}, {where}.loss_rows={loss_rows}",
            )
        metrics = data["metrics"]
        if not isinstance(metrics, list) or not all(_finite_values(m) for m in metrics):
            raise state_error(
                source,
                "`metrics` must be a list of the metric variables' values (finite numbers or "
                "nested lists of them)",
                f"{where}.metrics={shortened(metrics)}",
            )
        values = {k: v for k, v in data.items() if k != "format"}
        values["cursor"] = Cursor(**cursor)
        values["loss_sum"] = float(loss_sum)
        return cls(**values, source=source)


_FIELDS = (
    "cursor",
    "seed",
    "shuffle",
    "placement",
    "num_rows",
    "num_replicas",
    "global_batch_size",
    "steps_per_epoch",
    "loss_sum",
    "loss_rows",
    "metrics",
    "order",
)
_CURSOR_FIELDS = ("epoch", "step", "data_epoch", "data_step")
_LARGEST_ROW_LOSS = float(np.finfo(np.float32).max)
FIX = (
    "Resume from the backup directory as `fit` wrote it (the file was edited, damaged or "
    "comes from another run), or delete the directory to start afresh."
)


def state_error(source: str, constraint: str, received: str, fix: str = FIX) -> ValueError:
    """The error for a resume state's field: `constraint` starts with the
    field's name, `received` is `name=value` (the JSON path in the file)."""
    return ValueError(
        _errors.message(
            f"A shardfeed resume state's {constraint}.", f"{source}: {received}", fix
        )
    )


def shortened(value: Any) -> str:
    """A value as the errors show it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_fields(source: str, where: str, data: dict[str, Any], expected: set[str]) -> None:
    missing = [k for k in sorted(expected) if k not in data]
    unknown = [k for k in sorted(data) if k not in expected]
    if missing or unknown:
        parts = [f"missing {where}.{k}" for k in missing]
        parts += [f"unknown {where}.{k}" for k in unknown]
        raise ValueError(
            _errors.message(
                "A shardfeed resume state must have exactly the fields shardfeed writes.",
                f"{source}: {', '.join(parts)}",
                FIX,
            )
        )


def _count(source: str, where: str, value: Any, low: int) -> int:
    field = where.removeprefix("state.")
    if not (_errors.is_integer(value) and value >= low):
        raise state_error(
            source, f"`{field}` must be an integer >= {low}", f"{where}={shortened(value)}"
        )
    if value >= 2**63:  # counts are int64 in the compiled loop
        raise state_error(source, f"`{field}` must be below 2**63", f"{where}={shortened(value)}")
    return int(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _finite_values(value: Any) -> bool:
    if isinstance(value, list):
        return all(_finite_values(v) for v in value)
    return isinstance(value, int | float) and _is_finite(value)  # bools too (bool variables)


def epoch_span(epoch: int, steps_per_epoch: int | None, data_steps: int) -> tuple[int, int, int]:
    """Fit epoch `epoch`'s place in the data: `(data_epoch, start, stop)`, the
    steps `[start, stop)` of pass `data_epoch` over the data.

    As Keras' epoch iterator on finite data: a fit epoch takes up to
    `steps_per_epoch` steps of the current pass and ends when the pass runs
    out (Keras warns "Your input ran out of data"); the next epoch starts the
    next pass. A pass of `data_steps` steps thus holds
    `ceil(data_steps / steps_per_epoch)` fit epochs (one without
    `steps_per_epoch`, or when it is at least `data_steps`).

    Example:
        >>> [epoch_span(e, 5, 12) for e in range(4)]
        [(0, 0, 5), (0, 5, 10), (0, 10, 12), (1, 0, 5)]
    """
    if steps_per_epoch is None or steps_per_epoch >= data_steps:
        return epoch, 0, data_steps
    per_pass = -(-data_steps // steps_per_epoch)
    start = (epoch % per_pass) * steps_per_epoch
    return epoch // per_pass, start, min(start + steps_per_epoch, data_steps)
