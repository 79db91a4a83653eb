"""`model.fit`'s arguments under `shardfeed.fit`, and the head both backends' `fit` share.

`begin` -> `FitCall`: the ranks' agreement on `settings` (`start_call`), then
`validation_split`, the epochs, `validation_freq` and the step counts, checked;
and `refuse`: the `model.fit` arguments `fit` cannot honour, each with its
replacement (docs/keras.md).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

import keras
import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._common.agreement import plain
from shardfeed._common.fingerprint import function_fingerprint
from shardfeed._training.arguments import start_call
from shardfeed._training.options import FitOptions

# Keras' own text (`EpochIterator._interrupted_warning`), for the same case.
RAN_OUT_WARNING = (
    "Your input ran out of data; interrupting training. "
    "Make sure that your dataset or generator can generate "
    "at least `steps_per_epoch * epochs` batches. "
    "You may need to use the `.repeat()` "
    "function when building your dataset."
)


def warn_if_ran_out(steps_per_epoch: int | None, steps_ran: int, stopped: bool) -> None:
    """Keras' `RAN_OUT_WARNING` after an epoch that ran `steps_ran` of
    `steps_per_epoch` steps because the data ran out (not because a callback
    stopped training), at the first caller outside shardfeed (the user's `fit`)."""
    if steps_per_epoch and steps_ran < steps_per_epoch and not stopped:
        warnings.warn(RAN_OUT_WARNING, stacklevel=_outside_shardfeed())


def _outside_shardfeed() -> int:
    """The `stacklevel`, for a `warnings.warn` in the caller, of the first frame
    outside the package. Counted, not fixed: the wrappers between a user's `fit`
    and its epochs differ per backend and engine (progress, peers, world)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


_ARRAYS = (
    "`shardfeed.fit` trains on a `ShardedResidentDataset` (the rows live on the devices).",
    "Build one and pass it: `shardfeed.fit(model, ShardedResidentDataset(x, y, "
    "per_replica_batch_size=..., seed=0))`.",
)
_NO_PIPELINE = (
    "`shardfeed.fit` has no input pipeline to tune: batches are gathered on the device "
    "inside the compiled step.",
    "Drop the argument.",
)

# model.fit argument -> (constraint, fix), for those `shardfeed.fit` refuses.
REFUSED: dict[str, tuple[str, str]] = {
    "x": _ARRAYS,
    "y": _ARRAYS,
    "shuffle": (
        "The dataset shuffles, with a new order every epoch drawn from `(seed, epoch)`.",
        "Build the dataset with `ShardedResidentDataset(..., shuffle=True, seed=0)` "
        "(or `shuffle=False`).",
    ),
    "sample_weight": (
        "Sample weights are a column of the dataset.",
        "Build it with `ShardedResidentDataset(x, y, sample_weight, per_replica_batch_size=...)`.",
    ),
    "validation_steps": (
        "Validation covers every row of `validation_data` exactly once.",
        "Pass fewer rows, e.g. `validation_data=(x_val[:n], y_val[:n])`.",
    ),
    "validation_batch_size": (
        "Arrays in `validation_data` are evaluated with the training per-replica batch "
        "(the numbers do not depend on it).",
        "To choose it, pass `validation_data=ShardedResidentDataset(x_val, y_val, "
        "per_replica_batch_size=..., shuffle=False)`.",
    ),
    "max_queue_size": _NO_PIPELINE,
    "workers": _NO_PIPELINE,
    "use_multiprocessing": _NO_PIPELINE,
}


def refuse(unsupported: dict[str, Any], dataset: Any) -> None:
    """Raises for the first of `unsupported` (keyword arguments `fit` does not take).

    Raises:
        TypeError: Always, when `unsupported` is not empty: `batch_size` with
            the dataset's global batch, a `model.fit` argument with what to
            use instead, any other name as Python would.
    """
    if not unsupported:
        return
    name, value = next(iter(unsupported.items()))
    if name == "batch_size":
        plan = getattr(dataset, "plan", None)
        now = (
            f" (this dataset: {plan.per_replica_batch_size} per replica x "
            f"{plan.num_replicas} replicas = {plan.global_batch_size})"
            if plan is not None
            else ""
        )
        raise TypeError(
            _errors.message(
                "The batch belongs to the dataset: the global batch is "
                f"`per_replica_batch_size x num_replicas_in_sync`{now}.",
                f"batch_size={value!r}",
                "Build the dataset with `ShardedResidentDataset(x, y, per_replica_batch_size="
                "batch_size // world.num_replicas_in_sync)`.",
            )
        )
    if name in REFUSED:
        constraint, fix = REFUSED[name]
        raise TypeError(_errors.message(constraint, f"{name}={_short(value)}", fix))
    raise TypeError(
        _errors.message(
            f"`shardfeed.fit` got an unexpected keyword argument `{name}`.",
            f"{name}={_short(value)}",
            "See docs/keras.md for each `model.fit` argument and what to use instead.",
        )
    )


def check_positional(dataset: Any, positional: tuple[Any, ...], dataset_type: type[Any]) -> None:
    """Refuses Keras' `fit(x, y)` positional form and a missing dataset
    (`dataset_type`: the backend's `ShardedResidentDataset`).

    Raises:
        TypeError: For positional arguments after the dataset (arrays, as in
            `shardfeed.fit(model, x, y)`, with how to build the dataset), or
            for no dataset at all.
    """
    if positional:
        arrays = dataset is not None and not isinstance(dataset, dataset_type)
        constraint, fix = (
            _ARRAYS
            if arrays
            else (
                "`shardfeed.fit` takes the model and the dataset by position, the rest by keyword.",
                "Pass the rest by name, e.g. `epochs=5`.",
            )
        )
        shown = (dataset, *positional) if arrays else positional
        received = ", ".join(_short(v) for v in shown)
        raise TypeError(_errors.message(constraint, f"positional arguments {received}", fix))
    if dataset is None:
        raise TypeError(
            _errors.message("`shardfeed.fit` needs a dataset.", "dataset=None", _ARRAYS[1])
        )


def _short(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} of shape {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_schedule(validation_freq: Any) -> Callable[[int], bool]:
    """Whether to validate after epoch `e` (0-based), as Keras' `_should_eval`:
    an int validates every that many epochs, a list after the epochs it names
    (1-based).

    Raises:
        ValueError: For anything but an int >= 1 or a list of ints >= 1.
    """
    if _errors.is_integer(validation_freq) and validation_freq >= 1:
        every = int(validation_freq)
        return lambda epoch: (epoch + 1) % every == 0
    if isinstance(validation_freq, (list, tuple)) and all(
        _errors.is_integer(e) and e >= 1 for e in validation_freq
    ):
        epochs = {int(e) for e in validation_freq}
        return lambda epoch: epoch + 1 in epochs
    raise ValueError(
        _errors.message(
            "`validation_freq` must be an integer >= 1 (validate every that many epochs) "
            "or a list of epochs counted from 1 (as in Keras).",
            f"validation_freq={validation_freq!r}",
            "Pass e.g. `validation_freq=1`, or `validation_freq=[1, 5, 10]`.",
        )
    )


def split_validation(
    dataset: Any, validation_split: float, validation_data: Any = None
) -> tuple[Any, Any]:
    """Keras' `validation_split`: `dataset.split(validation_split)` (the last
    rows as validation data, the whole let go of while the parts are held).

    Raises:
        ValueError: With `validation_data` given too, or as `split` does.
    """
    if validation_data is not None:
        raise ValueError(
            _errors.message(
                "Pass either `validation_data` or `validation_split`, not both.",
                f"validation_split={validation_split!r} and validation_data",
                "Keep one of the two.",
            )
        )
    return dataset.split(validation_split)


def validation_arrays(validation_data: Any) -> tuple[Any, Any, Any]:
    """`fit`'s `validation_data` as `(x, y, sample_weight)`: a tuple of two or
    three is `(x, y[, sample_weight])`, as in Keras' `fit`. (`evaluate` and
    `predict` read a tuple as the model's inputs, as Keras does.)"""
    if isinstance(validation_data, tuple) and 2 <= len(validation_data) <= 3:
        x, y, sample_weight = (*validation_data, None)[:3]
        return x, y, sample_weight
    return validation_data, None, None


def max_steps(steps: int | None, stacklevel: int = 3) -> int | None:
    """`steps` capped by `keras.config.max_steps_per_epoch()`, with Keras' warning
    (`stacklevel`: the frame it points at, the user's call by default)."""
    cap = keras.config.max_steps_per_epoch()
    if cap and (not steps or cap < steps):
        warnings.warn(f"Limiting steps_per_epoch to {cap}", stacklevel=stacklevel)
        return int(cap)
    return steps


def check_steps(initial_step: Any, steps_per_epoch: Any, data_steps: int) -> None:
    """Checks `fit`'s `initial_step` and `steps_per_epoch` (`data_steps`: one pass).

    Raises:
        ValueError: For a `steps_per_epoch` below 1 or an `initial_step`
            outside the first epoch.
    """
    if steps_per_epoch is not None and not (
        _errors.is_integer(steps_per_epoch) and steps_per_epoch >= 1
    ):
        raise ValueError(
            _errors.message(
                "`steps_per_epoch` must be None (one pass over the data) or an integer >= 1.",
                f"steps_per_epoch={steps_per_epoch!r}",
                f"Pass e.g. `steps_per_epoch={data_steps}` (one pass), or leave it out.",
            )
        )
    epoch_steps = min(steps_per_epoch or data_steps, data_steps)
    if not (_errors.is_integer(initial_step) and 0 <= initial_step < epoch_steps):
        raise ValueError(
            _errors.message(
                f"`initial_step` must be an integer in [0, {epoch_steps}) (the steps of "
                "`initial_epoch` already done).",
                f"initial_step={initial_step!r}",
                "Pass the `{batch}` of a `ModelCheckpoint(save_freq=N)` file name, or 0.",
            )
        )


def epochs_to_run(epochs: object, initial_epoch: object, stacklevel: int = 3) -> tuple[int, int]:
    """`fit`'s `(epochs, initial_epoch)` checked, on both backends, with
    Keras' debugging cap (`keras.config.set_max_epochs`) and its warning.

    Raises:
        ValueError: Unless both are integers >= 0.
    """
    if not (
        _errors.is_integer(epochs)
        and _errors.is_integer(initial_epoch)
        and epochs >= 0  # type: ignore[operator]
        and initial_epoch >= 0  # type: ignore[operator]
    ):
        raise ValueError(
            _errors.message(
                "`epochs` and `initial_epoch` must be integers >= 0.",
                f"epochs={epochs!r}, initial_epoch={initial_epoch!r}",
                "Pass e.g. `epochs=10` (and `initial_epoch=k` to resume after epoch k).",
            )
        )
    count, first = int(epochs), int(initial_epoch)  # type: ignore[call-overload]
    max_epochs = keras.config.max_epochs()
    if max_epochs and max_epochs < count:
        # The user's `fit` call by default, as Keras' warning points there.
        warnings.warn(f"Limiting epochs to {max_epochs}", stacklevel=stacklevel)
        count = max_epochs
    return count, first


@dataclasses.dataclass(frozen=True)
class FitArguments:
    """`fit`'s own arguments as the caller passed them, before any check
    (`begin` checks them; the ranks compare them first, `settings`)."""

    epochs: Any = 1
    initial_epoch: Any = 0
    initial_step: Any = 0
    steps_per_epoch: Any = None
    validation_data: Any = None
    validation_split: Any = 0.0
    validation_freq: Any = 1
    class_weight: Any = None
    callbacks: Any = None
    options: Any = None


@dataclasses.dataclass(frozen=True)
class FitCall:
    """`fit`'s arguments once the checks both backends share have passed (`begin`).

    Attributes:
        dataset: The training dataset (without `validation_split`'s rows).
        validation_data: `validation_data`, or `validation_split`'s rows.
        epochs: The epochs to run, Keras' `max_epochs` applied.
        initial_epoch: The first epoch's index.
        initial_step: The steps of `initial_epoch` already done.
        steps_per_epoch: The step cap per epoch (Keras' `max_steps_per_epoch`
            applied), or None for one pass over the data.
        should_validate: `validation_freq` as "validate after epoch i?".
    """

    dataset: Any
    validation_data: Any
    epochs: int
    initial_epoch: int
    initial_step: int
    steps_per_epoch: int | None
    should_validate: Callable[[int], bool]


def begin(model: keras.Model, dataset: Any, given: FitArguments) -> FitCall:
    """The head of both backends' `fit`, after their own model and dataset
    checks: the call's first collective (`start_call`: the ranks agree on
    `settings`, before a split builds datasets), then `validation_split`,
    the epochs, `validation_freq` and the step counts, checked.

    Raises:
        ValueError: For ranks that disagree, and as `split_validation`,
            `epochs_to_run`, `validation_schedule` and `check_steps`.
    """
    start_call(dataset.world, "fit", lambda: settings(model, dataset, given))
    validation_data = given.validation_data
    if given.validation_split:
        dataset, validation_data = split_validation(
            dataset, given.validation_split, validation_data
        )
    # stacklevel 4: the frame that called `fit`, as before this head was shared.
    epochs, initial_epoch = epochs_to_run(given.epochs, given.initial_epoch, stacklevel=4)
    should_validate = validation_schedule(given.validation_freq)
    steps_per_epoch = max_steps(given.steps_per_epoch, stacklevel=4)
    check_steps(given.initial_step, steps_per_epoch, dataset.plan.steps_per_epoch)
    return FitCall(
        dataset,
        validation_data,
        epochs,
        initial_epoch,
        int(given.initial_step),
        None if steps_per_epoch is None else int(steps_per_epoch),
        should_validate,
    )


def settings(model: keras.Model, dataset: Any, given: FitArguments) -> dict[str, Any]:
    """What decides how many steps and collectives this rank's `fit` runs, as
    the ranks compare it (before any check of the values, so ranks that
    disagree hear it rather than one raising while another waits): one rank
    with other epochs or steps waits in a collective the others never join;
    validation data on one rank only builds a dataset (a collective) there alone.
    The dataset's own arguments were compared when it was built. `verbose` and
    other callbacks may differ (e.g. a chief-only `TensorBoard`); a
    `BackupAndRestore` writes and reads on every rank, so its presence and
    `save_freq` may not."""
    backups = [
        getattr(c, "save_freq", None)
        for c in given.callbacks or []
        if isinstance(c, keras.callbacks.BackupAndRestore)
    ]
    compared = {
        "epochs": given.epochs,
        "initial_epoch": given.initial_epoch,
        "initial_step": given.initial_step,
        "steps_per_epoch": given.steps_per_epoch,
        "dataset steps per epoch": getattr(getattr(dataset, "plan", None), "steps_per_epoch", None),
        "validation_split": given.validation_split,
        "validation_freq": given.validation_freq,
        "validation_data": _data_shape(given.validation_data),
        "class_weight": given.class_weight,
        "BackupAndRestore save_freq": backups,
        **options_settings(model, given.options),
    }
    return {name: plain(value) for name, value in compared.items()}


def options_settings(model: keras.Model, options: Any) -> dict[str, Any]:
    """Every `FitOptions` field and the compiled `steps_per_execution`, as
    the ranks compare them (`fit`, `evaluate`): they decide the calls."""
    options = FitOptions() if options is None else options
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        fields = dataclasses.fields(options)
        described = {f"options.{f.name}": getattr(options, f.name) for f in fields}
    else:
        described = {"options": options}
    described["compile's steps_per_execution"] = getattr(model, "steps_per_execution", 1)
    described.update(compile_settings(model))
    return {name: plain(value) for name, value in described.items()}


def compile_settings(model: keras.Model) -> dict[str, Any]:
    """What `compile` set that decides each step's loss, updates and calls: its
    serialized loss, metrics and optimizer (learning rate included), the code
    of a loss function of the user's, `run_eagerly` and `jit_compile`. A rank
    with another loss trained wrong without a word (TensorFlow) or failed only
    at `predict`/`save` (JAX); `run_eagerly` on one rank only aborted (JAX) or
    raised a raw collective error (TensorFlow)."""
    try:
        with warnings.catch_warnings():
            # Keras 3.15's optimizer config reads its learning rate with
            # `np.array(variable)`, which warns on JAX (`__array__` without `copy`).
            warnings.simplefilter("ignore", DeprecationWarning)
            config = model.get_compile_config() or {}
    except Exception:  # an object Keras cannot serialize: its type is compared
        config = {"loss": getattr(model, "loss", None)}
    described: dict[str, Any] = {
        f"compile's {name}": _unnamed(value)
        for name, value in config.items()
        if name != "steps_per_execution"
    }
    loss = getattr(model, "loss", None)
    if callable(loss) and not isinstance(loss, keras.losses.Loss):
        described["compile's loss function"] = function_fingerprint(loss)
    described["compile's run_eagerly"] = bool(getattr(model, "run_eagerly", False))
    described["compile's jit_compile"] = getattr(model, "jit_compile", None)
    return described


def _unnamed(config: Any) -> Any:
    """A serialized config without its "name" entries: Keras numbers generated
    names per process (a second `Adam()` is "adam_1"), which decide nothing."""
    if isinstance(config, dict):
        return {k: _unnamed(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list | tuple):
        return [_unnamed(v) for v in config]
    return config


def _data_shape(data: Any) -> Any:
    """`validation_data` as the ranks compare it: None, a dataset's rows and
    batch, or each array's row count (not its values: the dataset built
    from them compares rows)."""
    if data is None:
        return None
    if hasattr(data, "num_rows") and hasattr(data, "per_replica_batch_size"):
        return {"rows": data.num_rows, "per_replica_batch_size": data.per_replica_batch_size}
    if isinstance(data, list | tuple):
        return [_data_shape(item) for item in data]
    if isinstance(data, dict):
        return {str(k): _data_shape(v) for k, v in data.items()}
    shape: Any = getattr(data, "shape", None)
    if hasattr(shape, "__len__"):  # a tuple, or TensorFlow's `TensorShape`
        return {"rows": plain(shape[0]) if len(shape) else None}
    return plain(data) if np.isscalar(data) else type(data).__name__
