"""Where a `fit` stands, as a few integers, and resuming it at that exact step.

The cursor (`cursor_at`, `FitPosition`: the base of both backends' runs), what
a resume may change (another number of replicas keeps the global batch, or is
refused when the order is not global; `adapt`, `check_run`) and `capture`.
Enough because an epoch's order is a function of `(seed, data epoch)` and the
plan (docs/resume.md).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import keras
import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.plan import ShardPlan, plan_shards
from shardfeed._training.resume_state import (
    Cursor,
    ResumeState,
    epoch_span,
    shortened,
    state_error,
)

logger = logging.getLogger("shardfeed")


def cursor_at(epoch: int, step: int, steps_per_epoch: int | None, data_steps: int) -> Cursor:
    """The cursor with `step` steps of fit epoch `epoch` done."""
    data_epoch, start, _ = epoch_span(epoch, steps_per_epoch, data_steps)
    return Cursor(epoch, step, data_epoch, start + step)


class FitPosition:
    """Where one `fit` call stands, on either backend: its training plan (a
    resume on another number of replicas keeps the checkpoint's global
    batch), the cursor a `BackupAndRestore` saves and a restarted fit starts
    at, and the steps this call ran. `epochs.FitRun` (TensorFlow) and
    `_jax/training.py`'s run add their loops and `capture`.

    Args:
        dataset: The training dataset (either backend's).
        initial_epoch: Fit epoch to start at.
        initial_step: Steps of `initial_epoch` already done (a resume from a
            mid-epoch `ModelCheckpoint`).
        steps_per_epoch: Steps per fit epoch (None: one pass over the data).
    """

    def __init__(
        self, dataset: Any, initial_epoch: int, initial_step: int, steps_per_epoch: int | None
    ) -> None:
        self.dataset = dataset
        self.plan: ShardPlan = dataset.plan
        self.steps_per_epoch = steps_per_epoch
        self.cursor = self._cursor(initial_epoch, initial_step)
        self.steps_run = 0  # steps run by this fit call, for save frequencies
        self.state: ResumeState | None = None

    def _cursor(self, epoch: int, step: int) -> Cursor:
        return cursor_at(epoch, step, self.steps_per_epoch, self.plan.steps_per_epoch)

    @property
    def epoch_steps(self) -> int:
        """Steps of a fit epoch, as Keras' `params["steps"]` (an epoch may
        end sooner, when the pass over the data runs out)."""
        return self.steps_per_epoch or self.plan.steps_per_epoch

    def resume(self, state: ResumeState) -> None:
        """Continues from `state` (a backup's): checks it fits this dataset,
        world and `steps_per_epoch`, takes the plan that keeps its global
        batch, and starts at its cursor."""
        self.plan = adapt(state, self.dataset, self.steps_per_epoch)
        self.state = state
        self.cursor = state.cursor


def metric_variables(model: keras.Model) -> list[Any]:
    """The model's metric variables in the resume state's order."""
    return [v for m in model.metrics for v in m.variables]


def restore_metrics(
    model: keras.Model,
    values: list[Any],
    source: str = "the resume state",
    zero_sums: bool = False,
) -> None:
    """Sets the metric variables to global `values`: assigned outside the
    replicas, a sync-on-read SUM variable splits the value over its replicas
    (so reading it sums back); `zero_sums` (Horovod's ranks but 0, which hold
    their own parts) sets the summed ones to zeros instead."""
    variables = metric_variables(model)
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
                f"state.metrics[{i}]={shortened(value)}",
            )
        arrays.append(array.astype(v.dtype))
    for v, value in zip(variables, arrays, strict=True):
        if zero_sums and getattr(v, "aggregation", "sum") == "sum":
            value = np.zeros_like(value)
        v.assign(value)


def adapt(
    state: ResumeState, dataset: Any, steps_per_epoch: int | None
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
    if mid_epoch and state.order != dataset.order_name:
        raise ValueError(
            _errors.message(
                "Resuming inside an epoch needs that epoch's order again; the checkpoint "
                "was written under another epoch order"
                + (
                    " (a resume state of format 1, from before both backends shared one order)."
                    if state.order is None
                    else " (another backend's streamed or unmoved rows, or another shardfeed)."
                ),
                f"checkpoint order={state.order!r}, dataset order={dataset.order_name!r}, "
                f"step {state.cursor.data_step} of the epoch",
                'Resume from a checkpoint taken at an epoch boundary (save_freq="epoch"), '
                "or with the backend, residency and shardfeed version that wrote it.",
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
    dataset: Any,
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
        order=dataset.order_name,
    )
