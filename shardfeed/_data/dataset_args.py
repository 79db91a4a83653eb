"""What both backends' `ShardedResidentDataset` share, before their storage.

The argument checks and their messages, the training and evaluation plans,
the dropped-rows line and `split`'s arithmetic, and `DatasetBase`: the
construction up to the storage (`_start`), `split`, and the read-only
properties. A backend's dataset subclasses it and provides the hooks
(`_TRANSFORM_EXAMPLE`, `_check_backend_args`, `_take_world`, `_let_go`,
optionally `_split_kwargs`), then holds the rows its own way.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterator
from typing import Any, Generic, Literal, NamedTuple, Self, TypeVar

import numpy as np
import optree

from shardfeed._common import errors as _errors
from shardfeed._common import model_sync as _model_sync
from shardfeed._data import agreement as _agreement
from shardfeed._data import augment_blocks as _augment_blocks
from shardfeed._data import order as _order
from shardfeed._data import plan as _plan
from shardfeed._data import sources as _sources
from shardfeed._data.batch import Batch
from shardfeed._data.options import LoadOptions
from shardfeed._distribute import launch_env as _launch_env
from shardfeed._distribute import progress as _progress

logger = logging.getLogger("shardfeed")

# Seeds are int64 in TensorFlow's stateless ops and non-negative in NumPy's
# `default_rng` (streamed epochs, JAX's orders): [0, 2**63) works in both.
MAX_SEED = 2**63


def num_rows_of(x: Any, y: Any = None, sample_weight: Any = None) -> int:
    """Rows of arrays a dataset would be built from (checked as it checks them)."""
    return int(_sources.columns_from_arrays(x, y, sample_weight).num_rows)


def check_seed(seed: object) -> int | None:
    """Refuses a seed outside `[0, 2**63)`; returns it as an int (or None)."""
    if seed is not None and not (_errors.is_integer(seed) and 0 <= seed < MAX_SEED):  # type: ignore[operator]
        raise ValueError(
            _errors.message(
                "`seed` must be an integer in [0, 2**63) (TensorFlow's stateless "
                "shuffle takes it as an int64; NumPy's generator needs it non-negative).",
                f"seed={seed!r}",
                "Pass e.g. `seed=0`, or `seed=None` with `shuffle=False`.",
            )
        )
    return None if seed is None else int(seed)  # type: ignore[call-overload]


def check_transform(transform: object, example: str = "tf.cast(x, 'float32') / 255") -> None:
    """Refuses a `transform` that is not a function."""
    if transform is not None and not callable(transform):
        raise TypeError(
            _errors.message(
                "`transform` must be a function of a batch's `x`.",
                f"type(transform)={type(transform).__name__}",
                f"Pass e.g. `transform=lambda x: {example}`.",
            )
        )


def check_shuffle(
    shuffle: object, seed: int | None, placement: str
) -> bool | Literal["local"]:
    """Validates `shuffle` (True: global, "local", False) and returns it.

    Raises:
        ValueError: For another value, a shuffle without a seed, or
            `shuffle="local"` with `placement="replicate"`.
    """
    if isinstance(shuffle, bool | np.bool_):
        shuffle = bool(shuffle)
    elif not (isinstance(shuffle, str) and shuffle == "local"):
        raise ValueError(
            _errors.message(
                '`shuffle` must be True (the global order), "local" (each replica '
                "shuffles its own shard) or False (rows in order).",
                f"shuffle={shuffle!r}",
                'Pass shuffle=True, shuffle="local" or shuffle=False.',
            )
        )
    if shuffle and seed is None:
        raise ValueError(
            _errors.message(
                "Shuffling requires a seed, so that every replica and every "
                "rerun draws the same epoch order.",
                f"shuffle={shuffle!r}, seed=None",
                "Pass `seed=<int>`, or `shuffle=False` to keep the rows in order.",
            )
        )
    if shuffle == "local" and placement == "replicate":
        raise ValueError(
            _errors.message(
                'shuffle="local" needs placement="shard" (each replica shuffles the '
                "rows it holds; replicated rows already take the global order).",
                "shuffle='local', placement='replicate'",
                'Use shuffle=True with placement="replicate".',
            )
        )
    return "local" if shuffle == "local" else bool(shuffle)


def check_augment(augment: Any, seed: int | None) -> None:
    """Refuses an `augment` that is not a function, or one without a seed."""
    if augment is not None and not callable(augment):
        raise TypeError(
            _errors.message(
                "`augment` must be a function `(x, seed) -> x`.",
                f"type(augment)={type(augment).__name__}",
                "Pass e.g. `augment=shardfeed.augment.flip_left_right()`.",
            )
        )
    if augment is not None and seed is None:
        raise ValueError(
            _errors.message(
                "Augmenting requires a seed, so that reruns and resumed runs draw "
                "the same augmentations.",
                "augment=<function>, seed=None",
                "Pass `seed=<int>`.",
            )
        )


class Plans(NamedTuple):
    """A dataset's evaluation plan, and its training plan or why it has none."""

    eval_plan: _plan.ShardPlan
    train_plan: _plan.ShardPlan | None
    train_plan_error: ValueError | None


def plans(
    num_rows: int,
    num_replicas: int,
    per_replica_batch_size: int,
    placement: _plan.Placement,
    drop_remainder: bool,
) -> Plans:
    """The evaluation plan (raises for bad sizes) and the training plan.

    A dataset only evaluated or predicted on may admit no training epoch
    (fewer rows than replicas): that is an error only once `fit` asks, so
    the training plan's error is kept, not raised.
    """
    eval_plan = _plan.plan_shards(
        num_rows, num_replicas, per_replica_batch_size, placement, training=False
    )
    try:
        train_plan = _plan.plan_shards(
            num_rows, num_replicas, per_replica_batch_size, placement, drop_remainder,
            training=True,
        )
    except ValueError as err:
        return Plans(eval_plan, None, err)
    return Plans(eval_plan, train_plan, None)


# True while `evaluate`, `predict` or `validation_data` wraps arrays in a
# dataset that never trains (`for_evaluation`).
_evaluation_only = contextvars.ContextVar("evaluation_only", default=False)


@contextlib.contextmanager
def for_evaluation() -> Iterator[None]:
    """Datasets built inside only evaluate or predict: `log_dropped` stays
    silent (their every row is evaluated; a training epoch's drop would be
    news about an epoch that never runs)."""
    token = _evaluation_only.set(True)
    try:
        yield
    finally:
        _evaluation_only.reset(token)


def moves_rows(shuffle: bool | str, plan: _plan.ShardPlan) -> bool:
    """Whether the dataset being built moves its rows for training epochs
    (`_plan.uses_exchange`, the rule), decided once: not rows in order in a
    dataset built only to evaluate or predict (`for_evaluation`, `split`'s
    validation part), which never trains, so the move and the staging the
    memory check counts for it would buy nothing."""
    if shuffle is False and _evaluation_only.get():
        return False
    return _plan.uses_exchange(shuffle, plan)


def log_dropped(train_plan: _plan.ShardPlan | None, is_chief: bool) -> None:
    """Says, once (on the chief), how many rows each training epoch leaves out."""
    if train_plan is None or not train_plan.dropped_rows_per_epoch or not is_chief:
        return
    if _evaluation_only.get():
        return
    logger.warning(
        "shardfeed: %d of %d rows are left out of each training epoch so "
        "every replica runs %d equal steps (%s).",
        train_plan.dropped_rows_per_epoch,
        train_plan.num_rows,
        train_plan.steps_per_epoch,
        "drop_remainder=True"
        if train_plan.drop_remainder
        else "a replica would have no row in the last step",
    )


def split_at(num_rows: int, validation_split: object) -> int:
    """Keras' `validation_split`: the first row of the validation part.

    Raises:
        ValueError: For a fraction outside (0, 1) or one that leaves a side empty.

    Example:
        >>> split_at(10, 0.25)
        7
    """
    if not (isinstance(validation_split, (int, float)) and 0 < validation_split < 1):
        raise ValueError(
            _errors.message(
                "`validation_split` must be a fraction between 0 and 1 (exclusive).",
                f"validation_split={validation_split!r}",
                "Pass e.g. `validation_split=0.2` to validate on the last 20% of the rows.",
            )
        )
    at = math.floor(num_rows * (1.0 - validation_split))  # as Keras
    if at in (0, num_rows):
        raise ValueError(
            _errors.message(
                "`validation_split` must leave rows on both sides.",
                f"validation_split={validation_split!r} of {num_rows} rows",
                "Use a fraction that leaves at least one training and one validation row.",
            )
        )
    return at


def validation_batch_size(plan: _plan.ShardPlan, validation_rows: int) -> int:
    """The validation part's per-replica batch: the training one, shrunk for
    few rows (it pads rather than drops)."""
    return max(1, min(plan.per_replica_batch_size, validation_rows // plan.num_replicas))


def split_kwargs(
    dataset: Any, plan: _plan.ShardPlan, validation_rows: int, **options: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments of `split`'s training and validation datasets: the
    training part keeps the shuffle, seed, drops and `augment`; the
    validation part is unshuffled with its batch shrunk for few rows."""
    common = dict(placement=plan.placement, transform=dataset.transform,
                  load_options=dataset.load_options, **options)
    training = dict(
        per_replica_batch_size=plan.per_replica_batch_size,
        shuffle=dataset.shuffle,
        seed=dataset.seed,
        drop_remainder=plan.drop_remainder,
        augment=dataset.augment,  # training only: validation never augments
        **common,
    )
    validation = dict(
        per_replica_batch_size=validation_batch_size(plan, validation_rows),
        shuffle=False,
        **common,
    )
    return training, validation


def describe_plan(plan: _plan.ShardPlan, training: bool) -> str:
    """The plan's part of `describe()`: replicas, batches, steps, drops."""
    return (
        f"placement={plan.placement!r}, {plan.num_replicas} replica(s) x "
        f"{plan.per_replica_batch_size} rows = global batch {plan.global_batch_size}; "
        f"{plan.steps_per_epoch} steps/epoch, {plan.dropped_rows_per_epoch} rows "
        f"dropped/epoch{'' if training else ' (evaluation only)'}"
    )



def label_column(y: Any, target: tuple[Any, ...]) -> int:
    """The column index of the target of `y` at `target` (keys and positions,
    `()` for a single `y`), for `label_stats`.

    Raises:
        ValueError: If `target` does not lead to one array of `y`.

    Example:
        >>> label_column({"kind": 1, "score": 2}, ("kind",))
        1
    """
    column = y
    try:
        for key in target:
            column = column[key]
    except (KeyError, IndexError, TypeError):
        column = None
    if not isinstance(column, int):
        raise ValueError(
            _errors.message(
                "`target` must lead to one array of `y`.",
                f"target={target!r}",
                "Pass the keys and positions of one leaf of `element_spec.y`.",
            )
        )
    return column


WorldT = TypeVar("WorldT")


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One stored column's rows: `shape` with a leading None (the rows), as
    a `tf.TensorSpec` of a batch, and the dtype as given."""

    shape: tuple[int | None, ...]
    dtype: np.dtype


BUILT_BEFORE_INIT = (
    "A dataset holds its rows on the replicas of the world it was built in, and "
    "this one was built before `shardfeed.init()`, which has since started another: "
    "training it would use {built_replicas} replica(s) while the model's world has "
    "{replicas}."
)


def check_built_in_the_world(built: Any, initialized: Any) -> None:
    """Refuses a dataset built before `shardfeed.init()` once `init` started a
    different world (pure: both worlds are plain values).

    Raises:
        RuntimeError: When the numbers of processes or replicas differ.
    """
    if initialized is None:
        return
    shapes = [(w.world_size, w.num_replicas_in_sync) for w in (built, initialized)]
    if shapes[0] == shapes[1]:
        return
    raise RuntimeError(
        _errors.message(
            BUILT_BEFORE_INIT.format(
                built_replicas=built.num_replicas_in_sync,
                replicas=initialized.num_replicas_in_sync,
            ),
            f"dataset.world: world_size={built.world_size}, num_replicas_in_sync="
            f"{built.num_replicas_in_sync}; shardfeed.init(): world_size="
            f"{initialized.world_size}, num_replicas_in_sync={initialized.num_replicas_in_sync}",
            "Call shardfeed.init() before building the dataset (first thing in the script), "
            "then build the dataset again.",
        )
    )


class DatasetBase(Generic[WorldT]):
    """What both backends' `ShardedResidentDataset` share, one implementation:
    the construction up to the storage (`_start`), `split`, and the read-only
    properties of what a dataset was built with and plans. A subclass
    provides the hooks below `_start` and owns its storage and epochs."""

    columns: Any
    _world: WorldT
    _shuffle: bool | Literal["local"]
    _seed: int | None
    _transform: Callable[[Any], Any] | None
    _augment: Callable[[Any, Any], Any] | None
    _load_options: LoadOptions
    _eval_plan: _plan.ShardPlan
    _train_plan: _plan.ShardPlan | None
    _train_plan_error: ValueError | None
    _moves_rows: bool
    # A subclass's constructor sets its backend's `initialized_world` here
    # when the dataset took its world before `shardfeed.init()` was called.
    _world_before_init: Callable[[], Any] | None = None
    # Datasets `split` made, per fraction: repeated fits upload them once.
    _splits: dict[float, tuple[Any, Any]]

    def _start(
        self,
        x: Any,
        y: Any,
        sample_weight: Any,
        *,
        per_replica_batch_size: int,
        shuffle: bool | Literal["local"],
        seed: int | None,
        drop_remainder: bool,
        placement: _plan.Placement,
        transform: Callable[[Any], Any] | None,
        augment: Callable[[Any, Any], Any] | None,
        load_options: LoadOptions | None,
        strategy: Any,
    ) -> LoadOptions:
        """The construction both backends share, before their storage: the
        arguments checked (`_check_backend_args` for the backend's own), the
        columns read, the world taken, the workers' agreement on the rows and
        settings checked, and the plans. Returns the `LoadOptions`."""
        shuffle = check_shuffle(shuffle, seed, placement)
        seed = check_seed(seed)
        check_transform(transform, self._TRANSFORM_EXAMPLE)
        check_augment(augment, seed)
        options = load_options or LoadOptions()
        self._check_backend_args(strategy, options)
        self.columns = _sources.columns_from_arrays(x, y, sample_weight)
        if transform is None:  # the blocks will see the stored rows: check them now
            _augment_blocks.check_columns(augment, self.columns)
        self._world, before_init = self._take_world(strategy)
        if before_init is not None:
            self._world_before_init = before_init
            if self._world.world_size == 1:  # type: ignore[attr-defined]
                _launch_env.refuse_workers_without_init(os.environ)
        if options.check_agreement:
            settings = _agreement.dataset_settings(
                per_replica_batch_size=per_replica_batch_size, drop_remainder=drop_remainder,
                placement=placement, shuffle=shuffle, seed=seed, options=options,
                transform=transform, augment=augment,
            )
            _agreement.check_agreement(self.columns, self.world, settings)  # type: ignore[arg-type]
        self._shuffle, self._seed = shuffle, seed
        self._transform, self._augment, self._load_options = transform, augment, options
        self._splits = {}
        built = plans(
            self.columns.num_rows, self.world.num_replicas_in_sync,  # type: ignore[attr-defined]
            per_replica_batch_size, placement, drop_remainder,
        )
        self._eval_plan, self._train_plan = built.eval_plan, built.train_plan
        self._train_plan_error = built.train_plan_error
        self._moves_rows = moves_rows(shuffle, built.eval_plan)
        return options

    # What each backend provides to `_start` and `split`.
    _TRANSFORM_EXAMPLE: str

    def _check_backend_args(self, strategy: Any, options: LoadOptions) -> None:
        """Refuses what only this backend refuses (before the rows are read)."""
        raise NotImplementedError

    def _take_world(self, strategy: Any) -> tuple[WorldT, Callable[[], Any] | None]:
        """The world whose replicas will hold the rows, and the backend's
        `initialized_world` when it is taken before `shardfeed.init()` (else None)."""
        raise NotImplementedError

    def _split_kwargs(self) -> dict[str, Any]:
        """The backend's own keyword arguments of `split`'s two datasets."""
        return {}

    def _let_go(self) -> None:
        """Drops the device rows; they are loaded again when next used."""
        raise NotImplementedError

    def split(self, validation_split: float) -> tuple[Self, Self]:
        """Keras' `validation_split`: the last `validation_split` of the rows,
        taken before sharding, as validation data; the rest as training data.

        Both parts are built from this dataset's sources (its arrays or files,
        read again) with its options; the validation part unshuffled, its
        batch shrunk for few rows (it pads rather than drops). This dataset
        lets go of its device rows first, so the devices hold the two parts,
        not the whole as well (it loads them again, from its sources, when
        next used). Repeated calls with one fraction return the same parts.

        Returns:
            `(training, validation)` datasets.

        Raises:
            ValueError: For a fraction outside (0, 1) or one that leaves a
                side empty.

        Example:
            >>> training, validation = ds.split(0.2)
        """
        at = split_at(self.num_rows, validation_split)
        cached = self._splits.get(float(validation_split))
        if cached is not None:
            return cached
        train_kw, val_kw = split_kwargs(
            self, self.plan, self.num_rows - at, **self._split_kwargs()
        )
        self._let_go()
        kind = type(self)
        training = kind(*self.columns.rows(0, at), **train_kw)
        with for_evaluation():  # validation data: never trained on
            validation = kind(*self.columns.rows(at, self.num_rows), **val_kw)
        self._splits[float(validation_split)] = (training, validation)
        return training, validation

    def check_loop_model(self, model: Any) -> None:
        """`iterator(model=)`'s check on both backends: with several workers,
        `model`'s variables (and its compiled optimizer's) compared across
        them, refused on every worker when they differ (a collective)."""
        if model is not None:
            # Counted for `shardfeed launch`'s progress watch: a rank that
            # calls it alone is seen waiting for the others.
            with _progress.call("iterator(model=)'s model check"):
                _model_sync.check_in_sync(
                    self.world,  # type: ignore[arg-type]
                    _model_sync.model_variables(model),
                    "start a training loop of your own",
                )

    @property
    def world(self) -> WorldT:
        """The `World` whose replicas hold the rows (ranks, local devices; on
        TensorFlow also the strategy).

        Raises:
            RuntimeError: If the dataset was built before `shardfeed.init()`
                and `init` has since started another world (more replicas
                or processes): the rows sit on the old one's devices.
        """
        if self._world_before_init is not None:
            check_built_in_the_world(self._world, self._world_before_init())
            if self._world_before_init() is not None:
                self._world_before_init = None  # the same world: checked once
        return self._world

    @property
    def shuffle(self) -> bool | Literal["local"]:
        """The `shuffle` it was built with (True: the global order)."""
        return self._shuffle

    @property
    def seed(self) -> int | None:
        """The seed of the epoch permutations (and of `augment`), or None."""
        return self._seed

    @property
    def transform(self) -> Callable[[Any], Any] | None:
        """The function applied to each batch's `x`, or None."""
        return self._transform

    @property
    def augment(self) -> Callable[[Any, Any], Any] | None:
        """The function applied to training batches (`(x, seed) -> x` on
        TensorFlow, `(x, key) -> x` on JAX), or None."""
        return self._augment

    @property
    def load_options(self) -> LoadOptions:
        """The `LoadOptions` it was loaded with."""
        return self._load_options

    @property
    def order_name(self) -> str:
        """The name of the order training epochs take (`_data/order.NAME`:
        the same on every backend), which a resume state records: a resume
        inside an epoch needs that epoch's order again. A backend whose
        epochs deviate from it in some residency names that order instead."""
        return _order.NAME

    @property
    def moves_rows(self) -> bool:
        """Whether training epochs move rows between replicas to follow one
        order of all rows (`moves_rows`, decided when built); a backend may
        still hold them where they are (TensorFlow's streamed rows in order)."""
        return self._moves_rows

    @property
    def eval_plan(self) -> _plan.ShardPlan:
        """The evaluation plan: rows in order, nothing dropped, the last step padded."""
        return self._eval_plan

    @property
    def plan(self) -> _plan.ShardPlan:
        """The training plan: steps per epoch, dropped rows, each replica's rows.

        Raises:
            ValueError: If these rows admit no training epoch on these
                replicas (fewer rows than replicas).
        """
        if self._train_plan is None:
            raise self._train_plan_error  # type: ignore[misc]
        return self._train_plan

    def training_plan(self, per_replica_batch_size: int) -> _plan.ShardPlan:
        """The training plan for another per-replica batch, the rows staying
        where they are (the dataset is not changed). `fit` uses it to keep a
        checkpoint's global batch when resuming on another number of replicas
        (`_training/resume.py`) and passes it to `epoch_order`."""
        return _plan.plan_shards(
            self.num_rows,
            self.plan.num_replicas,
            per_replica_batch_size,
            self.plan.placement,
            self.plan.drop_remainder,
            training=True,
        )

    @property
    def num_rows(self) -> int:
        """Rows in the dataset (all workers together)."""
        return int(self.columns.num_rows)

    @property
    def per_replica_batch_size(self) -> int:
        """Rows each replica takes per step."""
        return self.eval_plan.per_replica_batch_size

    @property
    def global_batch_size(self) -> int:
        """Rows per step over all replicas."""
        return self.eval_plan.global_batch_size

    @property
    def has_targets(self) -> bool:
        """Whether it was built with `y`."""
        return self.columns.y is not None

    @property
    def row_specs(self) -> Batch:
        """`Batch` of a `RowSpec` per stored column, in the user's structures
        (None for an absent part): the columns as given, before `transform`,
        on both backends (e.g. `class_weight` checks its single target)."""
        columns = self.columns.columns

        def specs(structure: Any) -> Any:
            if structure is None:
                return None
            return optree.tree_map(
                lambda i: RowSpec((None, *columns[i].row_shape), columns[i].dtype), structure
            )

        return Batch(
            specs(self.columns.x), specs(self.columns.y), specs(self.columns.sample_weight)
        )
