"""`model.fit`'s arguments under `shardfeed.fit`: the ones that work, and what to use instead.

Owns the arguments a Keras user carries over from `model.fit`: refusing those
`fit` cannot honour with the replacement in the message (the full table is in
docs/keras.md), `validation_split` (`ShardedResidentDataset.split`: the last
rows, as in Keras, split before sharding) and `validation_freq` (an int or a list
of epochs, as in Keras).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset

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


def check_positional(dataset: Any, positional: tuple[Any, ...]) -> None:
    """Refuses Keras' `fit(x, y)` positional form and a missing dataset.

    Raises:
        TypeError: For positional arguments after the dataset (arrays, as in
            `shardfeed.fit(model, x, y)`, with how to build the dataset), or
            for no dataset at all.
    """
    if positional:
        arrays = dataset is not None and not isinstance(dataset, ShardedResidentDataset)
        constraint, fix = _ARRAYS if arrays else (
            "`shardfeed.fit` takes the model and the dataset by position, the rest by keyword.",
            "Pass the rest by name, e.g. `epochs=5`.",
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
    dataset: ShardedResidentDataset, validation_split: float, validation_data: Any = None
) -> tuple[ShardedResidentDataset, ShardedResidentDataset]:
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
