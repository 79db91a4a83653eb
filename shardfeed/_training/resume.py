"""Where a `fit` stands, as a few integers, and resuming it at that exact step.

Separation of concerns: this module owns the training cursor (fit epoch and
step, pass over the data and step in it), the resume state saved with a
checkpoint (`ResumeState`: the cursor, the data's seed and shape, the world
shape, the running loss and the metric variables' values -- never rows), and
what resuming may change: a different number of replicas keeps the global
batch and the global order, or is refused when the order is not global. The
backup callback (`backup.py`) writes and reads the state; the loop runs the
steps it names.

Why this is enough: an epoch's order is a pure function of
`(seed, data epoch)` and the plan, and step `s` of it takes fixed rows, so
"the remaining batches" after a resume are the steps `[s, steps_per_epoch)`
of the same order. Step numbers stay those of the uninterrupted epoch.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset
from shardfeed._data.plan import ShardPlan, plan_shards

logger = logging.getLogger("shardfeed")

FORMAT = 1


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


def cursor_at(epoch: int, step: int, steps_per_epoch: int | None, data_steps: int) -> Cursor:
    """The cursor with `step` steps of fit epoch `epoch` done."""
    data_epoch, start, _ = epoch_span(epoch, steps_per_epoch, data_steps)
    return Cursor(epoch, step, data_epoch, start + step)


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
            raise state_error(source, "`state` must be a JSON object", f"{where}={_short(data)}")
        if data.get("format") != FORMAT:
            raise ValueError(
                _errors.message(
                    f"A shardfeed resume state must have format {FORMAT}.",
                    f"{source}: {where}.format={_short(data.get('format'))}",
                    "Resume with the shardfeed version that wrote it, or start afresh.",
                )
            )
        _check_fields(source, where, data, {*_FIELDS, "format"})
        cursor = data["cursor"]
        if not isinstance(cursor, dict):
            raise state_error(
                source, "`cursor` must be a JSON object", f"{where}.cursor={_short(cursor)}"
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
                f"{where}.shuffle={_short(shuffle)}",
            )
        if data["placement"] not in ("replicate", "shard"):
            raise state_error(
                source,
                '`placement` must be "replicate" or "shard"',
                f"{where}.placement={_short(data['placement'])}",
            )
        loss_rows = _count(source, f"{where}.loss_rows", data["loss_rows"], 0)
        loss_sum = data["loss_sum"]
        if not _is_number(loss_sum) or not _is_finite(loss_sum):
            raise state_error(
                source,
                "`loss_sum` must be a finite number (the epoch's running loss: a run whose "
                "loss was not finite cannot be continued)",
                f"{where}.loss_sum={_short(loss_sum)}",
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
                f"{where}.metrics={_short(metrics)}",
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


def _short(value: Any) -> str:
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
            source, f"`{field}` must be an integer >= {low}", f"{where}={_short(value)}"
        )
    if value >= 2**63:  # counts are int64 in the compiled loop
        raise state_error(source, f"`{field}` must be below 2**63", f"{where}={_short(value)}")
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


def _metric_variables(model: keras.Model) -> list[Any]:
    return [v for m in model.metrics for v in m.variables]


def read_metrics(model: keras.Model, engine: Any) -> list[Any]:
    """The metric variables' global values (every rank must call it: under
    MultiWorkerMirroredStrategy reading a sync-on-read variable is a
    collective; under Horovod each rank holds its own part, summed here)."""
    values = []
    for v in _metric_variables(model):
        if engine.name == "horovod":
            value = tf.convert_to_tensor(v.value)
            if getattr(v, "aggregation", "sum") == "sum":
                value = engine.sum_across_replicas(value)
            values.append(np.asarray(value).tolist())
        else:
            values.append(np.asarray(v.numpy()).tolist())
    return values


def restore_metrics(
    model: keras.Model, values: list[Any], engine: Any, source: str = "the resume state"
) -> None:
    """Sets the metric variables to global `values`: assigned outside the
    replicas, a sync-on-read SUM variable splits the value over its replicas
    (so reading it sums back); under Horovod rank 0 takes the sums."""
    variables = _metric_variables(model)
    if len(variables) != len(values):
        raise ValueError(
            _errors.message(
                "A resumed model must have the metrics it was checkpointed with.",
                f"{len(values)} metric variables in the checkpoint, {len(variables)} "
                "in the model",
                "Compile the model with the same loss and metrics as the interrupted run.",
            )
        )
    arrays = []
    for i, (v, value) in enumerate(zip(variables, values, strict=True)):
        try:
            array = np.asarray(value)
        except ValueError:  # ragged lists
            array = np.asarray(None)
        if array.dtype == object or array.shape != tuple(v.shape):
            raise state_error(
                source,
                f"`metrics[{i}]` must hold the value of metric variable {v.path!r}, of "
                f"shape {tuple(v.shape)}",
                f"state.metrics[{i}]={_short(value)}",
            )
        arrays.append(array.astype(v.dtype))
    for v, value in zip(variables, arrays, strict=True):
        if engine.name == "horovod" and engine.world.rank != 0:
            if getattr(v, "aggregation", "sum") == "sum":
                value = np.zeros_like(value)
        v.assign(value)


def adapt(
    state: ResumeState, dataset: ShardedResidentDataset, steps_per_epoch: int | None
) -> ShardPlan:
    """Checks that `state` can resume on `dataset` in a `fit` with
    `steps_per_epoch` (see `check_run`); returns the training plan that keeps
    its global batch (the dataset's own, or one for another per-replica
    batch: the dataset is not changed).

    Raises:
        ValueError: For a different dataset, a cursor or running totals that
            the run could not have written, another `steps_per_epoch`, a
            mid-epoch resume on another number of replicas without a global
            order, or a global batch the new replica count does not divide.
    """
    plan = dataset.plan
    if (state.seed, state.shuffle, state.num_rows, state.placement) != (
        dataset.seed,
        dataset.shuffle,
        dataset.num_rows,
        plan.placement,
    ):
        raise ValueError(
            _errors.message(
                "A resumed fit must use the data it was checkpointed with (the same rows, "
                "placement, shuffle and seed): the order of the remaining steps depends on them.",
                f"checkpoint num_rows={state.num_rows}, placement={state.placement!r}, "
                f"shuffle={state.shuffle}, seed={state.seed}; dataset num_rows="
                f"{dataset.num_rows}, placement={plan.placement!r}, shuffle={dataset.shuffle}, "
                f"seed={dataset.seed}",
                "Build the dataset as in the interrupted run, or delete the backup to start "
                "afresh.",
            )
        )
    check_run(state, plan.drop_remainder, steps_per_epoch)
    m, g = plan.num_replicas, state.global_batch_size
    mid_epoch = state.cursor.data_step > 0
    if m != state.num_replicas and mid_epoch and not dataset.order_is_global:
        raise ValueError(
            _errors.message(
                "Resuming inside an epoch on another number of replicas needs the global "
                'order (shuffle=True with a full exchange, or placement="replicate"; not '
                f"streamed): with shuffle={dataset.shuffle!r} each replica's order is its "
                "own, so the rows left in the epoch cannot be known on the new replicas.",
                f"num_replicas={m} (checkpoint: {state.num_replicas}), "
                f"placement={plan.placement!r}, shuffle={dataset.shuffle!r}, "
                f"step {state.cursor.data_step} of the epoch",
                f"Resume on {state.num_replicas} replicas, or resume from a checkpoint taken "
                'at an epoch boundary (save_freq="epoch"), or train with the global order '
                "(shuffle=True).",
            )
        )
    fraction = dataset.load_options.exchange_fraction
    if mid_epoch and not dataset.order_is_replayable:
        raise ValueError(
            _errors.message(
                "Resuming inside an epoch needs that epoch's order again; a partial exchange "
                "(exchange_fraction < 1) mixes the rows each replica held before the epoch, "
                "and a restart reloads the shards as they were first loaded.",
                f"exchange_fraction={fraction}, step {state.cursor.data_step} of the epoch",
                'Resume from a checkpoint taken at an epoch boundary (save_freq="epoch"), '
                "or train with the full exchange (exchange_fraction=1).",
            )
        )
    if plan.global_batch_size == g:
        return plan
    if g % m:
        divisors = [d for d in range(1, g + 1) if g % d == 0]
        raise ValueError(
            _errors.message(
                "A resumed fit keeps the checkpoint's global batch, so the number of "
                "replicas must divide it.",
                f"global_batch_size={g} (checkpoint: {state.num_replicas} replicas), "
                f"num_replicas_in_sync={m}",
                f"Resume on a number of replicas that divides {g} (one of {divisors}), or "
                "start a new run with a new global batch.",
            )
        )
    if dataset.is_streaming:
        raise ValueError(
            _errors.message(
                "A streamed dataset's chunks are planned for its per-replica batch, so "
                "`fit` cannot change it to keep a checkpoint's global batch.",
                f"per_replica_batch_size={plan.per_replica_batch_size}, checkpoint "
                f"global_batch_size={g}, num_replicas_in_sync={m}",
                f"Build the dataset with `per_replica_batch_size={g // m}`.",
            )
        )
    if dataset.world.is_chief:
        logger.warning(
            "shardfeed: resuming a fit checkpointed with %d replica(s) on %d: per-replica "
            "batch %d so the global batch stays %d.",
            state.num_replicas,
            m,
            g // m,
            g,
        )
    return dataset.training_plan(g // m)


def check_run(state: ResumeState, drop_remainder: bool, steps_per_epoch: int | None) -> None:
    """Checks `state` against the run that wrote it (its data, world and
    `steps_per_epoch`) and the resuming `fit`'s `steps_per_epoch`.

    The cursor must be a position that run passes through: the step inside
    fit epoch `epoch` (the whole epoch done at most: a backup after its last
    call, before `on_epoch_end`), and the pass and step in the data that
    `cursor_at` gives for them. The running totals must be rows of the steps
    done. `steps_per_epoch` is the resuming fit's own (as Keras'
    `BackupAndRestore` resumes with `fit`'s arguments): honoured when it
    splits the data into the checkpoint's epochs (`None` and any value of at
    least one pass are one pass per epoch), refused otherwise -- the cursor
    and the epoch's running totals count that run's epochs.

    Raises:
        ValueError: Naming the file and the fields.
    """
    source, cursor = state.source, state.cursor
    try:
        written = plan_shards(
            state.num_rows,
            state.num_replicas,
            state.global_batch_size // state.num_replicas,
            state.placement,  # type: ignore[arg-type]
            drop_remainder,
            training=True,
        )
    except ValueError as err:
        raise state_error(
            source,
            "`num_replicas` and `global_batch_size` must give a training plan for `num_rows`",
            f"state.num_rows={state.num_rows}, state.num_replicas={state.num_replicas}, "
            f"state.global_batch_size={state.global_batch_size} ({err})",
        ) from None
    data_steps = written.steps_per_epoch
    data_epoch, start, stop = epoch_span(cursor.epoch, state.steps_per_epoch, data_steps)
    epoch_words = (
        f"fit epoch {cursor.epoch} is steps [{start}, {stop}) of pass {data_epoch} over the "
        f"data ({data_steps} steps per pass, steps_per_epoch={state.steps_per_epoch})"
    )
    if cursor.step > stop - start:
        raise state_error(
            source,
            f"`cursor.step` must be in [0, {stop - start}]: {epoch_words}",
            f"state.cursor.epoch={cursor.epoch}, state.cursor.step={cursor.step}",
        )
    where = cursor_at(cursor.epoch, cursor.step, state.steps_per_epoch, data_steps)
    if (cursor.data_epoch, cursor.data_step) != (where.data_epoch, where.data_step):
        raise state_error(
            source,
            f"`cursor.data_epoch` and `cursor.data_step` must be where the fit's cursor "
            f"lies in the data, pass {where.data_epoch} step {where.data_step} ({epoch_words}; "
            "the pass seeds the order)",
            f"state.cursor.data_epoch={cursor.data_epoch}, state.cursor.data_step="
            f"{cursor.data_step} (state.cursor.epoch={cursor.epoch}, state.cursor.step="
            f"{cursor.step})",
        )
    g = state.global_batch_size
    # Rows of the steps done: full steps of `g` rows, the pass's last perhaps
    # fewer; 0 when the model's own `train_step` returns the logs.
    if cursor.step and state.loss_rows and not (
        (cursor.step - 1) * g < state.loss_rows <= cursor.step * g
    ):
        raise state_error(
            source,
            f"`loss_rows` must be the rows of the {cursor.step} step(s) done "
            f"({(cursor.step - 1) * g + 1} to {cursor.step * g} with a global batch of {g}; "
            "0 under a model's own `train_step`)",
            f"state.loss_rows={state.loss_rows}, state.cursor.step={cursor.step}, "
            f"state.global_batch_size={g}",
        )
    if _one_pass_each(steps_per_epoch, data_steps) != _one_pass_each(
        state.steps_per_epoch, data_steps
    ):
        ckpt = state.steps_per_epoch
        keep = "leave `steps_per_epoch` out" if ckpt is None else f"pass `steps_per_epoch={ckpt}`"
        raise ValueError(
            _errors.message(
                "A resumed fit must split the data into the checkpoint's epochs: its cursor "
                "and the epoch's running loss and metrics count epochs of the checkpoint's "
                "`steps_per_epoch`, and `fit` keeps the `steps_per_epoch` it is given "
                "(as Keras' `BackupAndRestore` does).",
                f"steps_per_epoch={steps_per_epoch!r}; {source}: state.steps_per_epoch="
                f"{ckpt!r} ({data_steps} steps per pass over the data)",
                f"{keep[0].upper()}{keep[1:]} as the interrupted run did, or delete the backup "
                "directory to start afresh with the new epochs.",
            )
        )


def _one_pass_each(steps_per_epoch: int | None, data_steps: int) -> int | None:
    """`steps_per_epoch` as the epochs it gives (None: one pass per epoch)."""
    return None if steps_per_epoch is None or steps_per_epoch >= data_steps else steps_per_epoch


def capture(
    cursor: Cursor,
    totals: tuple[float, int],
    dataset: ShardedResidentDataset,
    plan: ShardPlan,
    steps_per_epoch: int | None,
    metrics: list[Any],
) -> ResumeState:
    """The resume state of a fit standing at `cursor` on `plan` (see `ResumeState`)."""
    return ResumeState(
        cursor=dataclasses.replace(cursor),
        seed=dataset.seed,
        shuffle=dataset.shuffle,
        placement=plan.placement,
        num_rows=dataset.num_rows,
        num_replicas=plan.num_replicas,
        global_batch_size=plan.global_batch_size,
        steps_per_epoch=steps_per_epoch,
        loss_sum=float(totals[0]),
        loss_rows=int(totals[1]),
        metrics=metrics,
    )
