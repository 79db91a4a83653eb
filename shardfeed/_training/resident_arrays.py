"""Resident mode: NumPy arrays given to Keras' `fit`/`evaluate`/`predict` use a resident copy.

`resident_arrays(enabled)` is the switch (a call, or a `with` block). While
it is on, the hooks (`keras_hooks.py`) send arrays here: each set of arrays is
uploaded once into a `ShardedResidentDataset` and kept in `_Cache` for later
calls on the same arrays (KerasTuner's trials, repeated `fit`s, `evaluate`
after `fit`), checked against the arrays' contents on every use, and let go
once nothing but the cache holds them; a finite `tf.data` pipeline is drained
once into arrays (`drained`). What cannot be made resident (other inputs,
arguments with no resident meaning, rows that do not fit) goes to Keras' own
path with a one-line reason.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import threading
import weakref
import zlib
from collections.abc import Callable, Hashable
from typing import Any

import keras
import numpy as np
from keras.src.trainers.data_adapters import is_tf_dataset

from shardfeed._common import errors as _errors
from shardfeed._data import dataset_args as _dataset_args
from shardfeed._data.dataset_args import DatasetBase
from shardfeed._data.options import LoadOptions
from shardfeed._training import backup as _backup
from shardfeed._training import keras_hooks as _hooks
from shardfeed._training.arguments import DEFAULT_EVAL_BATCH_SIZE
from shardfeed._training.options import FitOptions

# Keras' default `batch_size` for arrays.
KERAS_BATCH_SIZE = 32
# Uploads kept at once (each also within the memory check when it is built).
MAX_ENTRIES = 4
# Rows hashed per read when fingerprinting (bounded host memory for views).
_HASH_BYTES = 16 * 2**20

_state_lock = threading.Lock()
_enabled = False


# Lower case: a switch used as a call and as a context, like `torch.set_grad_enabled`.
class resident_arrays:
    """Turns resident mode on or off: NumPy arrays given to Keras' own
    `model.fit`, `model.evaluate` and `model.predict` train from a copy
    resident in device memory.

    A call switches it for the process; in a `with` block it is restored on
    leaving. While on, `model.fit(x, y, batch_size=..., shuffle=...,
    validation_split=..., validation_data=(xv, yv), sample_weight=...,
    class_weight=...)` with NumPy arrays (or dicts/lists of them) builds a
    `ShardedResidentDataset` with Keras' meaning of each argument
    (`batch_size` is the global batch; `shuffle=True` a new order every epoch;
    `validation_split` the last rows) and runs `shardfeed.fit` on it. The
    upload is reused by later calls on the same arrays (unchanged contents,
    checked) and let go when the arrays are gone or the mode is turned off.
    Inputs that cannot be made resident run Keras' own path, with a one-line
    reason when `verbose` is not 0.

    Args:
        enabled: True (default) to turn it on, False to turn it off (and
            drop every upload it holds).
        options: `FitOptions` for every call Keras' entry points hand to
            shardfeed while it is on (a resident dataset's too), e.g.
            `FitOptions(steps_per_execution=1)` for Keras' batch hooks at
            every step; None: shardfeed's defaults.

    Example:
        >>> with shardfeed.resident_arrays():
        ...     tuner.search(x, y, epochs=3, validation_data=(x_val, y_val))
    """

    def __init__(self, enabled: bool = True, *, options: FitOptions | None = None) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(
                _errors.message(
                    "`enabled` must be True or False.",
                    f"enabled={enabled!r}",
                    "Pass `shardfeed.resident_arrays(True)` or `(False)`.",
                )
            )
        if enabled and not _hooks.installed():
            raise RuntimeError(
                _errors.message(
                    "Resident mode needs shardfeed's Keras hooks, which are off in this "
                    "process.",
                    "shardfeed.disable_keras_hooks() was called",
                    "Start a new process without that call, or call `shardfeed.fit` on a "
                    "`ShardedResidentDataset` directly.",
                )
            )
        if options is not None and not isinstance(options, FitOptions):
            raise TypeError(
                _errors.message(
                    "`options` must be a `shardfeed.FitOptions` or None.",
                    f"type(options)={type(options).__name__}",
                    "Pass e.g. `options=shardfeed.FitOptions(steps_per_execution=1)`.",
                )
            )
        self._previous = set_enabled(enabled), _hooks.set_options(options if enabled else None)

    def __enter__(self) -> resident_arrays:
        return self

    def __exit__(self, *exc: object) -> None:
        set_enabled(self._previous[0])
        _hooks.set_options(self._previous[1])

    def __repr__(self) -> str:
        return f"shardfeed.resident_arrays({is_enabled()})"


def set_enabled(enabled: bool) -> bool:
    """Turns resident mode on or off; returns what it was."""
    global _enabled
    with _state_lock:
        previous, _enabled = _enabled, enabled
    if not enabled:
        CACHE.clear()
        _DRAINED.clear()
    return previous


def is_enabled() -> bool:
    return _enabled


@dataclasses.dataclass
class _Entry:
    dataset: DatasetBase[Any]
    x_leaves: tuple[np.ndarray, ...]
    leaves: tuple[np.ndarray, ...]  # x's, then y's and the sample weights'
    rows: tuple[int, int]
    where: Hashable
    batch: int  # per replica
    shuffle: bool
    crcs: tuple[int, ...]
    held: tuple[int, ...]  # references to each leaf the entry holds (the dataset's too)


class _Cache:
    """The uploads resident mode made, newest last."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._entries: list[_Entry] = []
        self.uploads = 0  # datasets built (tests count them)

    def clear(self) -> None:
        with self.lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def sweep(self) -> None:
        """Drops the entries whose arrays only the cache still holds.

        The dataset keeps its arrays (it reads them again when it reloads), so
        a weak reference would never fire: count the references instead. CPython
        counts them exactly, and `held` is what the entry itself holds
        (measured around the dataset's build, plus the entry's own tuples).
        A count below `held` is orphaned too: the build's count included a
        reference that went after it (JAX's CPU `device_put` aliases an
        aligned NumPy chunk and may let go of it later). A reference of the
        caller's only adds, so at worst an entry still in use is let go: the
        next call uploads again.
        """
        with self.lock:
            self._entries = [e for e in self._entries if not self._orphaned(e)]

    @staticmethod
    def _orphaned(entry: _Entry) -> bool:
        return all(n <= h for n, h in zip(_refs(entry.leaves), entry.held, strict=True))

    def find(
        self, leaves: tuple[np.ndarray, ...], rows: tuple[int, int], where: Hashable,
        x_only: bool = False, batch: int | None = None, shuffle: bool | None = None,
        seed: int | None = None,
    ) -> DatasetBase[Any] | None:
        """An upload of these arrays' rows on these devices (of this batch and
        shuffle when given) whose contents are unchanged; one whose arrays
        changed since is dropped."""
        with self.lock:
            for entry in reversed(self._entries):
                mine = entry.x_leaves if x_only else entry.leaves
                if (
                    len(mine) != len(leaves)
                    or any(a is not b for a, b in zip(mine, leaves, strict=True))
                    or entry.rows != rows
                    or entry.where != where
                    or (batch is not None and entry.batch != batch)
                    or (shuffle is not None and entry.shuffle != shuffle)
                    or (seed is not None and entry.dataset.seed != seed)
                ):
                    continue
                if _fingerprints(entry.leaves, rows) != entry.crcs:
                    self._entries.remove(entry)  # changed in place: upload again
                    continue
                self._entries.remove(entry)
                self._entries.append(entry)
                return entry.dataset
            return None

    def build(
        self, backend: _hooks.Backend, where: _hooks.Where, parts: tuple[Any, Any, Any],
        rows: tuple[int, int], per_replica_batch_size: int, shuffle: bool, training: bool,
        seed: int | None = None,
    ) -> DatasetBase[Any]:
        """Uploads `parts` (`(x, y, sample_weight)`, rows `rows` of them) and
        keeps the dataset; an upload of the same arrays' rows is dropped first.

        Raises:
            MemoryError: If the rows do not fit on a device, after dropping
                every other upload.
        """
        x_leaves = _leaves(parts[0])
        leaves = x_leaves + _leaves(parts[1]) + _leaves(parts[2])
        with self.lock:
            self._entries = [
                e for e in self._entries
                if not (e.rows == rows and e.where == where.key and _same(e.x_leaves, x_leaves))
            ][-(MAX_ENTRIES - 1):]
            before = _refs(leaves)
            try:
                dataset = self._make(backend, where, parts, rows, per_replica_batch_size,
                                     shuffle, training, seed)
            except MemoryError:
                if not self._entries:
                    raise
                self._entries.clear()
                before = _refs(leaves)
                dataset = self._make(backend, where, parts, rows, per_replica_batch_size,
                                     shuffle, training, seed)
            entry = _Entry(dataset, x_leaves, leaves, rows, where.key, per_replica_batch_size,
                           shuffle, _fingerprints(leaves, rows), ())
            after = _refs(leaves)
            # What the dataset took, the entry's two tuples, `_refs`' argument.
            entry.held = tuple(
                a - b + _count(leaves, leaf) + _count(x_leaves, leaf) + 1
                for a, b, leaf in zip(after, before, leaves, strict=True)
            )
            self._entries.append(entry)
            return dataset

    def _make(
        self, backend: _hooks.Backend, where: _hooks.Where, parts: tuple[Any, Any, Any],
        rows: tuple[int, int], per_replica_batch_size: int, shuffle: bool, training: bool,
        seed: int | None,
    ) -> DatasetBase[Any]:
        start, stop = rows
        floatx = np.dtype(keras.config.floatx())

        def rows_as_keras_reads_them(a: np.ndarray) -> np.ndarray:
            # Keras' array adapter casts every other float to floatx (a host
            # copy here, held by the dataset, gone with it).
            a = a[start:stop]
            return a.astype(floatx) if a.dtype.kind == "f" and a.dtype != floatx else a

        x, y, sample_weight = (
            None if p is None else keras.tree.map_structure(rows_as_keras_reads_them, p)
            for p in parts
        )
        # Evaluation pads rather than drops: shrink a batch larger than the rows.
        batch = per_replica_batch_size if training else max(
            1, min(per_replica_batch_size, (stop - start) // where.replicas)
        )
        kwargs = dict(
            per_replica_batch_size=batch, shuffle=shuffle,
            seed=(agreed_seed(where.world) if seed is None else seed) if shuffle else None,
            # Rows that do not fit go to Keras' own path, not to streaming.
            load_options=LoadOptions(streaming=False), **where.dataset_kwargs,
        )
        try:
            if training:
                dataset = backend.dataset_type(x, y, sample_weight, **kwargs)
            else:
                with _dataset_args.for_evaluation():
                    dataset = backend.dataset_type(x, y, sample_weight, **kwargs)
        except (TypeError, ValueError) as error:
            # Arrays the dataset refuses (lengths that differ, ...): Keras' own
            # path says it in Keras' words, or takes them.
            raise _Fallback(f"the arrays were refused ({str(error).splitlines()[0]})") from None
        self.uploads += 1
        return dataset


CACHE = _Cache()


def agreed_seed(world: Any) -> int:
    """A new shuffle seed, the same on every worker: drawn from Python's
    generator (which `keras.utils.set_random_seed` seeds, so a seeded script
    repeats), then rank 0's taken by all (an unseeded worker draws its own,
    and the ranks' datasets would disagree)."""
    seed = random.getrandbits(62)
    if world is None or world.world_size == 1:
        return seed
    drawn = world.all_gather_bytes(seed.to_bytes(8, "little"))
    return int.from_bytes(drawn[0], "little")


def _leaves(structure: Any) -> tuple[np.ndarray, ...]:
    return () if structure is None else tuple(keras.tree.flatten(structure))


def _refs(leaves: tuple[np.ndarray, ...]) -> tuple[int, ...]:
    """Each leaf's reference count, `getrefcount`'s argument included (no
    loop variable: a temporary is the only extra reference)."""
    return tuple([sys.getrefcount(leaves[i]) for i in range(len(leaves))])


def _count(leaves: tuple[np.ndarray, ...], leaf: np.ndarray) -> int:
    return sum(1 for other in leaves if other is leaf)


def _same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return len(a) == len(b) and all(p is q for p, q in zip(a, b, strict=True))


def _fingerprints(leaves: tuple[np.ndarray, ...], rows: tuple[int, int]) -> tuple[int, ...]:
    """crc32 of each leaf's rows (about 3.7 GB/s here: 35 ms for 128 MB)."""
    start, stop = rows
    out = []
    for leaf in leaves:
        crc = 0
        row_bytes = max(1, leaf.itemsize * math.prod(leaf.shape[1:]))
        step = max(1, _HASH_BYTES // row_bytes)
        for i in range(start, stop, step):
            crc = zlib.crc32(np.ascontiguousarray(leaf[i : min(stop, i + step)]).data, crc)
        out.append(crc)
    return tuple(out)


def why_not(structure: Any, name: str) -> str | None:
    """Why `structure` cannot be made resident (None when it can: NumPy
    arrays of numbers, alone or in dicts, lists and tuples)."""
    if structure is None:
        return None
    leaves = keras.tree.flatten(structure)
    for leaf in leaves:
        if not isinstance(leaf, np.ndarray):
            return f"`{name}` is a {type(leaf).__name__}, not NumPy arrays"
        if leaf.dtype.kind not in "biuf" or leaf.ndim == 0:
            return f"`{name}` has an array of dtype {leaf.dtype} and shape {leaf.shape}"
    return None if leaves else f"`{name}` holds no arrays"


class _Fallback(Exception):
    """Resident mode cannot take this call: Keras' own path runs."""


# tf.data's `cardinality()` for a pipeline that repeats forever, or whose
# length it cannot tell (a `filter`, ...).
_INFINITE, _UNKNOWN = -1, -2

# tf.data pipelines drained once: id -> (the pipeline, weakly; its rows as
# `(x, y, sample_weight)` arrays; whether it shuffles; its batch). The arrays
# are what the upload cache keys on, so a pipeline's upload is reused while
# the pipeline lives.
_DRAINED: dict[int, tuple[Any, tuple[Any, Any, Any], bool, int]] = {}


def _stages(pipeline: Any) -> Any:
    yield pipeline
    for parent in pipeline._inputs():
        yield from _stages(parent)


def drained(pipeline: Any) -> tuple[tuple[Any, Any, Any], bool, int]:
    """A finite `tf.data` pipeline's rows as arrays, read once in one pass
    (so `(x, y)` pairs stay pairs, whatever the pipeline's order), whether it
    shuffles and its batch; the same arrays again while the pipeline lives.

    Raises:
        _Fallback: For a pipeline that repeats forever, of unknown length,
            empty, or whose batches do not join into arrays.
    """
    found = _DRAINED.get(id(pipeline))
    if found is not None and found[0]() is pipeline:
        return found[1], found[2], found[3]
    cardinality = int(pipeline.cardinality())
    if cardinality == _INFINITE:
        raise _Fallback("the tf.data pipeline repeats forever")
    if cardinality == _UNKNOWN:
        raise _Fallback("the tf.data pipeline's length is unknown (e.g. a filter)")
    batches = list(pipeline.as_numpy_iterator())
    if not batches:
        raise _Fallback("the tf.data pipeline is empty")
    first = batches[0]
    width = len(first) if isinstance(first, tuple) and 1 <= len(first) <= 3 else 0
    elements = batches if width else [(b,) for b in batches]
    try:
        parts = tuple(
            keras.tree.map_structure(
                lambda *leaves: np.concatenate(leaves), *[e[i] for e in elements]
            )
            for i in range(max(width, 1))
        )
    except (ValueError, TypeError) as error:
        raise _Fallback(f"the tf.data batches do not join into arrays ({error})") from None
    x, y, sample_weight = (*parts, None, None)[:3]
    shuffles = any("Shuffle" in type(stage).__name__ for stage in _stages(pipeline))
    first_x = _leaves(elements[0][0])
    batch = int(first_x[0].shape[0]) if first_x else 0  # the first batch's rows
    key = id(pipeline)
    alive = weakref.ref(pipeline, lambda _: _DRAINED.pop(key, None))
    _DRAINED[key] = (alive, (x, y, sample_weight), shuffles, batch)
    return (x, y, sample_weight), shuffles, batch


def _say(reason: str, verbose: Any, where: _hooks.Where | None) -> None:
    if verbose != 0 and (where is None or where.is_chief):
        print(f"shardfeed: {reason}; running Keras' own input path.")


def _num_rows(parts: tuple[Any, Any, Any]) -> int:
    return int(_leaves(parts[0])[0].shape[0])


def _check(given: dict[str, Any], parts: tuple[Any, Any, Any], refused: tuple[str, ...]) -> None:
    if parts[0] is None:
        raise _Fallback("`x` is None")
    for name, value in zip(("x", "y", "sample_weight"), parts, strict=True):
        reason = why_not(value, name)
        if reason:
            raise _Fallback(reason)
    for name in refused:
        if name in given:
            raise _Fallback(f"`{name}` has no resident meaning")


def _per_replica(batch_size: Any, where: _hooks.Where) -> int:
    if not _errors.is_integer(batch_size) or batch_size < 1:
        raise _Fallback(f"batch_size={batch_size!r} is not a positive integer")
    if batch_size % where.replicas:
        raise _Fallback(
            f"batch_size={batch_size} does not divide over {where.replicas} replicas"
        )
    return int(batch_size) // where.replicas


def _eval_dataset(
    backend: _hooks.Backend, where: _hooks.Where, parts: tuple[Any, Any, Any],
    rows: tuple[int, int], batch_size: Any, x_only: bool = False,
) -> DatasetBase[Any]:
    leaves = _leaves(parts[0]) if x_only else (
        _leaves(parts[0]) + _leaves(parts[1]) + _leaves(parts[2])
    )
    found = CACHE.find(leaves, rows, where.key, x_only=x_only)
    if found is not None:
        return found
    batch = max(1, int(batch_size) // where.replicas) if batch_size else DEFAULT_EVAL_BATCH_SIZE
    return CACHE.build(backend, where, parts, rows, batch, shuffle=False, training=False)


Run = Callable[[], Any]


def _resident(route: Callable[[_hooks.Backend, keras.Model, dict[str, Any], _hooks.Where], Run]
              ) -> _hooks.Route:
    """The hooks' route for arrays: `route` makes the call's resident data
    and returns the shardfeed call to run; with resident mode off, or when
    the call cannot be resident (`_Fallback`, rows that do not fit), Keras'
    own path runs, the reason said at `verbose` > 0."""

    def attempt(backend: _hooks.Backend, model: keras.Model, given: dict[str, Any]) -> Any:
        # `_use_cached_eval_dataset`: Keras' own `fit` validating, a call
        # resident mode let Keras run.
        if not _enabled or "_use_cached_eval_dataset" in given:
            return _hooks.PASS
        CACHE.sweep()
        verbose = given.get("verbose", "auto")
        where = backend.where(model)
        try:
            run = route(backend, model, given, where)
        except _Fallback as reason:
            _say(str(reason), verbose, where)
            return _hooks.PASS
        except MemoryError as error:
            first = str(error).splitlines()[0]
            _say(f"the arrays do not fit on the devices ({first})", verbose, where)
            return _hooks.PASS
        return run()  # outside the `try`: shardfeed's own errors are raised

    return attempt


def _fit_route(
    backend: _hooks.Backend, model: keras.Model, given: dict[str, Any], where: _hooks.Where
) -> Run:
    parts = (given.get("x"), given.get("y"), given.get("sample_weight"))
    if is_tf_dataset(parts[0]):
        if parts[1] is not None or parts[2] is not None:
            raise _Fallback("`y` or `sample_weight` next to a tf.data pipeline")
        # Its batch and its shuffling (a seeded order of ours) decide.
        parts, shuffles, batch = drained(parts[0])
        given = {**given, "batch_size": batch, "shuffle": shuffles}
    _check(given, parts, ("validation_steps",))
    per_replica = _per_replica(given.get("batch_size", KERAS_BATCH_SIZE), where)
    shuffle = given.get("shuffle", True)
    if not isinstance(shuffle, bool | np.bool_):
        raise _Fallback(f"shuffle={shuffle!r} (only True or False are resident)")
    num_rows = _num_rows(parts)
    train_rows = (0, num_rows)
    validation_data = given.get("validation_data")
    split = given.get("validation_split", 0.0)
    if split and validation_data is None:
        at = math.floor(num_rows * (1.0 - split))  # Keras' split
        if at in (0, num_rows):
            raise _Fallback("validation_split leaves a side empty (Keras says so)")
        train_rows = (0, at)
        validation_data = _eval_dataset(
            backend, where, parts, (at, num_rows),
            given.get("validation_batch_size", given.get("batch_size")),
        )
    elif validation_data is not None:
        validation_data = _validation(backend, where, validation_data, given)
    leaves = _leaves(parts[0]) + _leaves(parts[1]) + _leaves(parts[2])
    # A backup resumes only on its own order: take its seed.
    seed = _backed_up_seed(given.get("callbacks")) if shuffle else None
    train = CACHE.find(leaves, train_rows, where.key, batch=per_replica,
                       shuffle=bool(shuffle), seed=seed)
    if train is None:
        train = CACHE.build(backend, where, parts, train_rows, per_replica, bool(shuffle),
                            training=True, seed=seed)
    keep = ("epochs", "verbose", "callbacks", "class_weight", "initial_epoch",
            "steps_per_epoch", "validation_freq")
    rest = _hooks.with_options({k: given[k] for k in keep if k in given})
    return lambda: backend.fit(model, train, validation_data=validation_data, **rest)


def _backed_up_seed(callbacks: Any) -> int | None:
    """The seed a `BackupAndRestore` among `callbacks` saved (None without one)."""
    for callback in callbacks or ():
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            found = _backup.read_state_file(str(callback.backup_dir))
            if found is not None:
                return found[0].seed
    return None


def _validation(
    backend: _hooks.Backend, where: _hooks.Where, validation_data: Any, given: dict[str, Any]
) -> Any:
    """`validation_data` arrays `(x, y[, sample_weight])` as a cached upload
    (a dataset stays as it is)."""
    if isinstance(validation_data, DatasetBase):
        return validation_data
    if is_tf_dataset(validation_data):
        parts = drained(validation_data)[0]
        _check({}, parts, ())
        return _eval_dataset(backend, where, parts, (0, _num_rows(parts)), None)
    if not (isinstance(validation_data, tuple) and 2 <= len(validation_data) <= 3):
        raise _Fallback("validation_data is not a tuple (x, y[, sample_weight])")
    parts = (*validation_data, None)[:3]
    _check({}, parts, ())
    return _eval_dataset(
        backend, where, parts, (0, _num_rows(parts)),
        given.get("validation_batch_size", given.get("batch_size")),
    )


def _validation_route(backend: _hooks.Backend, model: keras.Model, given: dict[str, Any]) -> Any:
    """`validation_data` next to a resident dataset: arrays uploaded once in
    resident mode (KerasTuner's trials), else as `shardfeed.fit` takes them."""
    validation_data = given["validation_data"]
    if not _enabled:
        return validation_data
    CACHE.sweep()
    try:
        return _validation(backend, backend.where(model), validation_data, given)
    except (_Fallback, MemoryError):
        return validation_data  # shardfeed.fit takes them, or says why not


def _evaluate_route(
    backend: _hooks.Backend, model: keras.Model, given: dict[str, Any], where: _hooks.Where
) -> Run:
    parts = (given.get("x"), given.get("y"), given.get("sample_weight"))
    if is_tf_dataset(parts[0]) and parts[1] is None and parts[2] is None:
        parts = drained(parts[0])[0]
    _check(given, parts, ("steps",))
    dataset = _eval_dataset(backend, where, parts, (0, _num_rows(parts)), given.get("batch_size"))
    rest: dict[str, Any] = {k: given[k] for k in ("callbacks", "return_dict") if k in given}
    rest = _hooks.with_options({**rest, "verbose": given.get("verbose", "auto")})
    return lambda: backend.evaluate(model, dataset, **rest)


def _predict_route(
    backend: _hooks.Backend, model: keras.Model, given: dict[str, Any], where: _hooks.Where
) -> Run:
    parts = (given.get("x"), None, None)
    if is_tf_dataset(parts[0]):
        parts = (drained(parts[0])[0][0], None, None)
    _check(given, parts, ("steps", "callbacks"))
    dataset = _eval_dataset(backend, where, parts, (0, _num_rows(parts)),
                            given.get("batch_size"), x_only=True)
    verbose = given.get("verbose", "auto")
    return lambda: _hooks.predict_with_bar(backend, model, dataset, {"verbose": verbose})


_hooks.set_array_route("fit", _resident(_fit_route))
_hooks.set_array_route("evaluate", _resident(_evaluate_route))
_hooks.set_array_route("predict", _resident(_predict_route))
_hooks.set_array_route("validation_data", _validation_route)
