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
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset
from shardfeed._data.plan import ShardPlan

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

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["format"] = FORMAT
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResumeState:
        if data.get("format") != FORMAT:
            raise ValueError(
                _errors.message(
                    f"A shardfeed resume state must have format {FORMAT}.",
                    f"format={data.get('format')!r}",
                    "Resume with the shardfeed version that wrote it, or start afresh.",
                )
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["cursor"] = Cursor(**values["cursor"])
        return cls(**values)


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


def restore_metrics(model: keras.Model, values: list[Any], engine: Any) -> None:
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
    for v, value in zip(variables, values, strict=True):
        value = np.asarray(value, dtype=v.dtype)
        if engine.name == "horovod" and engine.world.rank != 0:
            if getattr(v, "aggregation", "sum") == "sum":
                value = np.zeros_like(value)
        v.assign(value)


def order_is_global(dataset: ShardedResidentDataset) -> bool:
    """Whether step `s` of an epoch takes the same global rows on any number of
    replicas: the global order (`placement="replicate"`, shuffled or not, or
    sharded rows with `shuffle=True` and a full exchange).

    A sharded dataset with `shuffle="local"` or `False` draws one order per
    replica, a partial exchange (`exchange_fraction < 1`) mixes from the rows
    each replica happened to hold, and a streamed one shuffles chunks per
    replica: none keeps the rows of the first `s` steps when the replicas
    change.
    """
    if dataset.is_streaming:
        return False
    if dataset.plan.placement == "replicate":
        return True
    if dataset.shuffle is True:
        # Several replicas: the exchange, when it is a full one; one replica
        # holds every row and draws the global permutation itself.
        return dataset.plan.num_replicas == 1 or dataset.load_options.exchange_fraction == 1
    return dataset.shuffle is False and dataset.plan.num_replicas == 1


def adapt(state: ResumeState, dataset: ShardedResidentDataset) -> ShardPlan:
    """Checks that `state` can resume on `dataset`; returns the training plan
    that keeps its global batch (the dataset's own, or one for another
    per-replica batch: the dataset is not changed).

    Raises:
        ValueError: For a different dataset, a mid-epoch resume on another
            number of replicas without a global order, or a global batch the
            new replica count does not divide.
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
    m, g = plan.num_replicas, state.global_batch_size
    mid_epoch = state.cursor.data_step > 0
    if m != state.num_replicas and mid_epoch and not order_is_global(dataset):
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
    if mid_epoch and dataset.exchange is not None and fraction < 1:
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
