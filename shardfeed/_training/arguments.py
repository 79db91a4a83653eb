"""What `fit`, `evaluate` and `predict` accept, on either backend, and each call's start.

The model and data checks every entry point shares (the backend's dataset
class passed in), `transform` for arrays, `verbose`, `wrap_arrays` (arrays as
a dataset), and `start_call`: every call's first collective.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

import keras

from shardfeed._common import errors as _errors
from shardfeed._common.agreement import check_settings
from shardfeed._data import dataset_args as _dataset_args
from shardfeed._distribute import progress as _progress

DEFAULT_EVAL_BATCH_SIZE = 256

Transform = Callable[[Any], Any]

# The `transform` of the dataset each model was last fit on, for arrays given
# to `evaluate`/`predict` with `transform="auto"`. Weak keys: an entry lives as
# long as its model, and the model itself carries nothing new (it saves,
# clones and pickles as before).
FIT_TRANSFORMS: weakref.WeakKeyDictionary[keras.Model, Transform | None] = (
    weakref.WeakKeyDictionary()
)


def start_call(world: Any, call: str, settings: Callable[[], dict[str, Any]]) -> None:
    """The first collective of every `fit`, `evaluate` and `predict`, before
    a split or arrays build a dataset: tells `shardfeed launch`'s progress
    watch the call started, then refuses on every worker the `settings()`
    that differ across the workers (`check_settings`). One worker compares
    nothing, so it never builds them (serializing the compiled loss and
    optimizer took 0.2 ms a call)."""
    with _progress.call(f"{call}'s agreement on its arguments"):
        if world.world_size > 1:
            check_settings(world, call, settings())


def check_model(model: Any, needs_compile: bool) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            _errors.message(
                "shardfeed trains Keras 3 models (`keras.Model`).",
                f"type(model)={type(model).__name__}",
                "Build the model with `keras.Sequential`, the functional API or a "
                "`keras.Model` subclass.",
            )
        )
    if needs_compile and (
        not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None
    ):
        raise ValueError(
            _errors.message(
                "The model must be compiled with an optimizer and a loss first.",
                f"model.compiled={getattr(model, 'compiled', False)}",
                "Call `model.compile(optimizer=..., loss=..., metrics=[...])` "
                "before `shardfeed.fit` or `shardfeed.evaluate`.",
            )
        )


def check_dataset(
    dataset: Any, needs_targets: bool, name: str = "dataset", *, dataset_type: type[Any]
) -> Any:
    if not isinstance(dataset, dataset_type):
        raise TypeError(
            _errors.message(
                f"`{name}` must be a `ShardedResidentDataset`.",
                f"type({name})={type(dataset).__name__}",
                "Build one with `ShardedResidentDataset(x, y, per_replica_batch_size=...)`.",
            )
        )
    if needs_targets and not dataset.has_targets:
        raise ValueError(
            _errors.message(
                "Training and evaluation need targets.",
                f"{name} built with y=None",
                "Pass `y` when building the dataset.",
            )
        )
    return dataset


def check_targets(
    data: Any, y: Any, sample_weight: Any, needs_targets: bool, *, dataset_type: type[Any]
) -> None:
    """`evaluate` on arrays needs `y` (unless the model's own `test_step` takes
    `x` alone); a tuple is the model's inputs (as in Keras' `model.evaluate`),
    not `(x, y)`."""
    if isinstance(data, dataset_type):
        return
    if _errors.is_integer(sample_weight):
        raise TypeError(
            _errors.message(
                "`shardfeed.evaluate`'s fourth positional argument is `sample_weight` "
                "(Keras' `model.evaluate` has `batch_size` there).",
                f"sample_weight={sample_weight!r}",
                "Pass the batch by name: `per_replica_batch_size=...`.",
            )
        )
    if y is None and needs_targets:
        tuple_note = (
            " A tuple is the model's inputs, as in Keras' `model.evaluate`, not `(x, y)`."
            if isinstance(data, tuple)
            else ""
        )
        raise ValueError(
            _errors.message(
                "Evaluating arrays needs their targets `y`." + tuple_note,
                f"type(x)={type(data).__name__}, y=None",
                "Call `shardfeed.evaluate(model, x, y)`.",
            )
        )


def check_batch_size(per_replica_batch_size: Any) -> None:
    """`evaluate`/`predict`'s batch for arrays: None or an integer >= 1."""
    if per_replica_batch_size is not None and not (
        _errors.is_integer(per_replica_batch_size) and per_replica_batch_size >= 1
    ):
        raise ValueError(
            _errors.message(
                "`per_replica_batch_size` must be None (the default batch) or an integer >= 1.",
                f"per_replica_batch_size={per_replica_batch_size!r}",
                f"Pass e.g. 256, or leave it as None for {DEFAULT_EVAL_BATCH_SIZE}.",
            )
        )

def resolve_transform(
    model: keras.Model,
    data: Any,
    transform: Transform | Literal["auto"] | None,
    *,
    dataset_type: type[Any],
) -> Transform | None:
    """The transform `evaluate`/`predict` apply to arrays (see their docs)."""
    auto = isinstance(transform, str) and transform == "auto"
    if isinstance(data, dataset_type):
        if not auto:
            raise ValueError(
                _errors.message(
                    "`transform` applies to arrays; a `ShardedResidentDataset` applies "
                    "the `transform` it was built with.",
                    f"transform={transform!r} with a ShardedResidentDataset",
                    "Leave `transform` out, or build the dataset with the transform.",
                )
            )
        return data.transform
    if auto:
        return FIT_TRANSFORMS.get(model)
    if transform is not None and not callable(transform):
        raise TypeError(
            _errors.message(
                '`transform` must be "auto", None or a function of a batch\'s `x`.',
                f"transform={transform!r}",
                'Pass e.g. `transform=lambda x: tf.cast(x, "float32") / 255`.',
            )
        )
    return transform


def resolve_verbose(verbose: int | str) -> int:
    if verbose == "auto":
        return 1
    if verbose not in (0, 1, 2):
        raise ValueError(
            _errors.message(
                '`verbose` must be "auto", 0, 1 or 2.',
                f"verbose={verbose!r}",
                "Use 0 (silent), 1 (progress bar) or 2 (one line per epoch).",
            )
        )
    return int(verbose)


D = TypeVar("D")


class DatasetArguments(Generic[D]):
    """`check_dataset`, `check_targets` and `resolve_transform` bound to one
    backend's dataset class: each backend's `inputs.py` exposes them.

    Example:
        >>> check_dataset = DatasetArguments(ShardedResidentDataset).check_dataset
    """

    def __init__(self, dataset_type: type[D]) -> None:
        self.dataset_type = dataset_type

    def check_dataset(self, dataset: Any, needs_targets: bool, name: str = "dataset") -> D:
        checked: D = check_dataset(dataset, needs_targets, name, dataset_type=self.dataset_type)
        return checked

    def check_targets(self, data: Any, y: Any, sample_weight: Any, needs_targets: bool) -> None:
        check_targets(data, y, sample_weight, needs_targets, dataset_type=self.dataset_type)

    def resolve_transform(self, model: keras.Model, data: Any, transform: Any) -> Transform | None:
        return resolve_transform(model, data, transform, dataset_type=self.dataset_type)


def wrap_arrays(
    dataset_type: type[Any],
    data: Any,
    y: Any,
    sample_weight: Any,
    per_replica_batch_size: int | None,
    replicas: int,
    template: Any = None,
    transform: Transform | None = None,
    max_steps: int | None = None,
    **backend_kwargs: Any,
) -> Any:
    """Arrays as an unshuffled `dataset_type` for evaluation or prediction,
    applying `transform` to their `x` (each backend's `as_dataset`, which
    passes its own `backend_kwargs`, e.g. the strategy).

    `template` (the training dataset, for `validation_data`) lends its
    placement, transform, batch size and load options. `max_steps` (Keras'
    `max_steps_per_epoch` cap) keeps only the rows of that many global
    batches, as Keras takes the first batches in row order.
    """
    rows = _dataset_args.num_rows_of(data, y, sample_weight)
    if per_replica_batch_size is not None:
        batch = int(per_replica_batch_size)
    elif template is not None:
        batch = template.per_replica_batch_size
    else:
        batch = DEFAULT_EVAL_BATCH_SIZE
    # Small arrays: shrink the batch so a step holds a real row on most replicas
    # (evaluation pads the rest).
    batch = max(1, min(batch, rows // replicas))
    if max_steps and max_steps * batch * replicas < rows:
        keep = max_steps * batch * replicas
        data, y, sample_weight = (
            None if v is None else keras.tree.map_structure(lambda a: a[:keep], v)
            for v in (data, y, sample_weight)
        )
    # Every row is evaluated: no word about rows a training epoch would drop.
    with _dataset_args.for_evaluation():
        return dataset_type(
            data,
            y,
            sample_weight,
            per_replica_batch_size=batch,
            shuffle=False,
            placement=template.plan.placement if template is not None else "shard",
            transform=template.transform if template is not None else transform,
            load_options=template.load_options if template is not None else None,
            **backend_kwargs,
        )
