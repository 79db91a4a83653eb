"""Keras' own `model.fit`, `evaluate` and `predict` on a resident dataset.

`install(backend)` wraps the three methods once per process, on the Keras
trainer class that defines them (so every `keras.Model`, one built before the
hook and a subclass whose `fit` calls `super().fit` included). A wrapper
sends a `ShardedResidentDataset` (and, in resident mode, arrays:
`resident_arrays.py`) to the backend's `shardfeed.fit`/`evaluate`/`predict`
with Keras' arguments mapped as Keras treats a `tf.data.Dataset`; every other
input reaches Keras' own method unchanged. `uninstall` puts Keras' back.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import keras

from shardfeed._common import errors as _errors
from shardfeed._data.dataset_args import DatasetBase

_METHODS = ("fit", "evaluate", "predict")


@dataclasses.dataclass(frozen=True)
class Where:
    """Where arrays given with a model would live: the replicas of the
    model's world, whether this process prints, a key for the cache (the
    same key, the same devices), the dataset's backend keyword arguments and
    the world itself."""

    replicas: int
    is_chief: bool
    key: Hashable
    dataset_kwargs: dict[str, Any]
    world: Any = None  # a `WorldLike`: its ranks agree on a drawn seed


@dataclasses.dataclass(frozen=True)
class Backend:
    """What a backend gives the hooks: its dataset class and entry points,
    and `where(model)`."""

    name: str
    dataset_type: Callable[..., DatasetBase[Any]]  # the backend's ShardedResidentDataset
    fit: Callable[..., Any]
    evaluate: Callable[..., Any]
    predict: Callable[..., Any]
    where: Callable[[keras.Model], Where]


_lock = threading.Lock()
# `FitOptions` for what the hooks run, set by `resident_arrays(options=)`.
_options: Any = None
_installed: dict[str, tuple[type, Callable[..., Any]]] = {}
_backend: Backend | None = None
_disabled = False


def install(backend: Backend) -> None:
    """Wraps Keras' `fit`, `evaluate` and `predict` (once per process; a
    no-op after `uninstall(for_good=True)`)."""
    global _backend
    with _lock:
        if _disabled:
            return
        if _backend is None:  # Keras' backend is fixed for the process: the first stays
            _backend = backend
        for name in _METHODS:
            if name in _installed:
                continue
            owner = next(c for c in keras.Model.__mro__ if name in vars(c))
            original = vars(owner)[name]
            setattr(owner, name, _wrap(name, original))
            _installed[name] = (owner, original)


def uninstall(for_good: bool = True) -> None:
    """Puts Keras' own methods back; with `for_good`, `install` does nothing
    from then on in this process."""
    global _disabled, _backend
    with _lock:
        _disabled = _disabled or for_good
        for name, (owner, original) in _installed.items():
            setattr(owner, name, original)
        _installed.clear()
        _backend = None


def set_options(options: Any) -> Any:
    """The `FitOptions` the routed calls take (None: shardfeed's defaults);
    returns the previous ones."""
    global _options
    previous, _options = _options, options
    return previous


def with_options(given: dict[str, Any]) -> dict[str, Any]:
    """`given` with the routed calls' `options`, when set."""
    return given if _options is None else {**given, "options": _options}


def installed() -> bool:
    """Whether Keras' methods are wrapped now."""
    return bool(_installed)


def backend() -> Backend | None:
    """The backend the hooks send to (None before `install`)."""
    return _backend


# What a route returns for "not ours: call Keras' method unchanged".
PASS = object()

# method name -> the route for it; `resident_arrays` adds the arrays' routes.
Route = Callable[[Backend, keras.Model, dict[str, Any]], Any]
_array_routes: dict[str, Route] = {}


def set_array_route(name: str, route: Route) -> None:
    """The route `resident_arrays` takes for arrays given to `name`."""
    _array_routes[name] = route


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)
    dataset_route = _DATASET_ROUTES[name]

    @functools.wraps(original)
    def method(self: keras.Model, *args: Any, **kwargs: Any) -> Any:
        # `_backend` is read once: another thread may uninstall meanwhile.
        backend = _backend
        if backend is not None:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # Keras raises its own error for the call
            if bound is not None:
                given = _chosen(signature, bound.arguments)
                if isinstance(given.get("x"), DatasetBase):
                    return dataset_route(backend, self, given)
                array_route = _array_routes.get(name)
                if array_route is not None:
                    result = array_route(backend, self, given)
                    if result is not PASS:
                        return result
                if name == "fit" and isinstance(given.get("validation_data"), DatasetBase):
                    raise ValueError(_VALIDATION_WITHOUT_TRAINING)
        return original(self, *args, **kwargs)

    return method  # `functools.wraps`: `method.__wrapped__` is Keras' own


def _chosen(signature: inspect.Signature, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments a caller chose: passed, and other than Keras' default
    (so a default such as `shuffle=True` is never mistaken for a choice)."""
    chosen: dict[str, Any] = {}
    for name, value in arguments.items():
        if name == "self":
            continue
        parameter = signature.parameters[name]
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            chosen.update(value)
            continue
        default = parameter.default
        plain = isinstance(default, bool | int | float | str) and type(value) is type(default)
        if value is default or (plain and value == default):
            continue
        chosen[name] = value
    return chosen


_VALIDATION_WITHOUT_TRAINING = _errors.message(
    "`validation_data` may be a `ShardedResidentDataset` when the training data is one "
    "too (Keras' own input path cannot read it).",
    "type(x) is not ShardedResidentDataset, type(validation_data)=ShardedResidentDataset",
    "Build the training data as a `ShardedResidentDataset`, or turn arrays resident "
    "with `shardfeed.resident_arrays()` (docs/keras.md).",
)


def _unsupported_with_dataset(name: str, what: str) -> ValueError:
    # Keras' words for a `tf.data.Dataset` (`raise_unsupported_arg`).
    return ValueError(
        _errors.message(
            f"When providing `x` as a ShardedResidentDataset, `{name}` should not be "
            f"passed: {what} are part of the dataset.",
            f"{name}=<{what}>",
            "Build the dataset with them: `ShardedResidentDataset(x, y, sample_weight, "
            "per_replica_batch_size=...)`.",
        )
    )


def _check_data_arguments(dataset: DatasetBase[Any], given: dict[str, Any]) -> None:
    """`y`, `sample_weight` and `batch_size` next to a dataset, as Keras
    treats a `tf.data.Dataset` (a batch that equals the dataset's passes)."""
    if given.pop("y", None) is not None:
        raise _unsupported_with_dataset("y", "the targets")
    if given.pop("sample_weight", None) is not None:
        raise _unsupported_with_dataset("sample_weight", "the sample weights")
    batch_size = given.pop("batch_size", None)
    if batch_size is not None and batch_size != dataset.global_batch_size:
        given["batch_size"] = batch_size  # refused by the entry point, naming the batch


def _fit_dataset(backend: Backend, model: keras.Model, given: dict[str, Any]) -> Any:
    dataset = given.pop("x")
    _check_data_arguments(dataset, given)
    split = given.pop("validation_split", 0.0)
    if split and given.get("validation_data") is None:
        raise ValueError(
            _errors.message(
                "`validation_split` is only supported for arrays in `model.fit` (as "
                "for a `tf.data.Dataset`).",
                f"validation_split={split!r}, x=ShardedResidentDataset",
                f"Split the dataset: `train, val = ds.split({split!r})`, then "
                "`model.fit(train, validation_data=val)`.",
            )
        )
    validation = _array_routes.get("validation_data")
    if validation is not None and "validation_data" in given:
        given["validation_data"] = validation(backend, model, given)
    shuffle = given.pop("shuffle", None)
    if shuffle is not None and bool(shuffle) != bool(dataset.shuffle):
        # Keras' own behaviour for a dataset: the dataset decides, with a warning.
        warnings.warn(
            f"`shuffle={shuffle!r}` was passed, but will be ignored since the data `x` "
            f"was provided as a ShardedResidentDataset, which shuffles as it was built "
            f"(shuffle={dataset.shuffle!r}).",
            stacklevel=3,  # the caller of `model.fit`
        )
    return backend.fit(model, dataset, **with_options(given))


def _evaluate_dataset(backend: Backend, model: keras.Model, given: dict[str, Any]) -> Any:
    dataset = given.pop("x")
    _check_data_arguments(dataset, given)
    given.setdefault("verbose", "auto")  # Keras' default (shardfeed.evaluate's is 0)
    return backend.evaluate(model, dataset, **with_options(given))


def _predict_dataset(backend: Backend, model: keras.Model, given: dict[str, Any]) -> Any:
    dataset = given.pop("x")
    _check_data_arguments(dataset, given)
    return predict_with_bar(backend, model, dataset, given)


def predict_with_bar(
    backend: Backend, model: keras.Model, dataset: DatasetBase[Any], given: dict[str, Any]
) -> Any:
    """`shardfeed.predict` for `model.predict`: Keras' `verbose` ("auto" or 1)
    shows its bar, complete once the predictions are back (they come back
    together); other arguments as `shardfeed.predict` takes them."""
    verbose = given.pop("verbose", "auto")
    if verbose not in (0, "auto", 1, 2):
        raise ValueError(
            _errors.message(
                '`verbose` must be "auto", 0, 1 or 2, as in Keras.',
                f"verbose={verbose!r}",
                "Pass verbose=0 for no output.",
            )
        )
    out = backend.predict(model, dataset, **with_options(given))
    if verbose != 0 and backend.where(model).is_chief:
        steps = dataset.eval_plan.steps_per_epoch
        bar = keras.utils.Progbar(steps, verbose=1 if verbose == "auto" else verbose)
        bar.update(steps, finalize=True)
    return out


_DATASET_ROUTES: dict[str, Route] = {
    "fit": _fit_dataset,
    "evaluate": _evaluate_dataset,
    "predict": _predict_dataset,
}


def disable_keras_hooks() -> None:
    """Puts Keras' own `model.fit`, `model.evaluate` and `model.predict`
    back, for the rest of the process.

    shardfeed wraps them when its first backend name is used, so they take a
    `ShardedResidentDataset` (and, in `shardfeed.resident_arrays()` mode,
    arrays); every other input reaches Keras unchanged. After this call they
    are Keras' again and `shardfeed.fit(model, dataset)` is the way in.

    Example:
        >>> shardfeed.disable_keras_hooks()
    """
    uninstall(for_good=True)
