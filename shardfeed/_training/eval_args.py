"""`model.evaluate`'s and `model.predict`'s other arguments under `shardfeed.evaluate` /
`predict`: `x=` as in Keras, the rest refused with what to use instead (docs/keras.md),
and the `settings` every rank's `evaluate` must share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree

from shardfeed._common import errors as _errors
from shardfeed._training.arguments import start_call
from shardfeed._training.fit_args import REFUSED as _FIT_REFUSED
from shardfeed._training.fit_args import _short, options_settings

_EVERY_ROW = (
    "`shardfeed.{fn}` covers every row exactly once (a partial last batch on "
    "its real rows only), so there is no step count to choose.",
    "Pass fewer rows instead, e.g. `x[:n]`.",
)
_BATCH = (
    "`shardfeed.{fn}` takes the batch per replica, `per_replica_batch_size` "
    "(the global batch is `per_replica_batch_size x num_replicas_in_sync`; "
    "the results do not depend on it).",
)


def resolve(
    fn: str, data: Any, positional: tuple[Any, ...], keras_args: dict[str, Any]
) -> Any:
    """Returns `data` (or `x=`, Keras' name for it) after refusing what
    `evaluate`/`predict` do not take.

    Args:
        fn: `"evaluate"` or `"predict"`, for the messages.
        data: The `data` argument (None when `x=` is used instead).
        positional: Positional arguments beyond `fit`'s own.
        keras_args: Keyword arguments beyond the function's own.

    Raises:
        TypeError: For extra positional arguments, for `x=` together with
            `data`, for no data at all, and for each refused Keras argument,
            with what to use instead.
    """
    if positional:
        own = "`model, x, y, sample_weight`" if fn == "evaluate" else "`model, x`"
        raise TypeError(
            _errors.message(
                f"`shardfeed.{fn}` takes {own} by position and the rest by keyword "
                "(Keras' `batch_size`, `verbose`, `steps`, ... come after `x` in "
                f"`model.{fn}`; here they are keywords or refused).",
                f"{len(positional)} more positional argument(s): "
                + ", ".join(_short(p) for p in positional),
                "Pass them by name, e.g. `verbose=0`, `per_replica_batch_size=...`; "
                "docs/keras.md has the table.",
            )
        )
    keras_args = dict(keras_args)
    if fn == "predict" and _is_zero(keras_args.get("verbose")):
        del keras_args["verbose"]  # silent, which predict always is
    if "x" in keras_args:
        x = keras_args.pop("x")
        if data is not None:
            raise TypeError(
                _errors.message(
                    f"`x` is Keras' name for `shardfeed.{fn}`'s `data`: pass one of the two.",
                    f"data={_short(data)} and x={_short(x)}",
                    "Keep one.",
                )
            )
        data = x
    if keras_args:
        _refuse(fn, *next(iter(keras_args.items())))
    if data is None:
        raise TypeError(
            _errors.message(
                f"`shardfeed.{fn}` needs data: a `ShardedResidentDataset` or arrays.",
                "data=None",
                f"Call `shardfeed.{fn}(model, x{', y' if fn == 'evaluate' else ''})` or "
                f"`shardfeed.{fn}(model, dataset)`.",
            )
        )
    return data


def _refuse(fn: str, name: str, value: Any) -> None:
    received = f"{name}={_short(value)}"
    if name == "batch_size":
        fix = (
            "Pass `per_replica_batch_size=batch_size // world.num_replicas_in_sync` "
            "(for arrays; a `ShardedResidentDataset` has its own batch)."
        )
        raise TypeError(_errors.message(_BATCH[0].format(fn=fn), received, fix))
    if name == "steps":
        raise TypeError(
            _errors.message(_EVERY_ROW[0].format(fn=fn), received, _EVERY_ROW[1])
        )
    if fn == "predict" and name in ("verbose", "callbacks"):
        raise TypeError(
            _errors.message(
                "`shardfeed.predict` runs no callbacks and prints no progress bar: "
                "the predictions of every row come back together at the end.",
                received,
                "Drop the argument, and act on the returned predictions instead"
                + (" (`verbose=0` is accepted)." if name == "verbose" else "."),
            )
        )
    if name in ("max_queue_size", "workers", "use_multiprocessing"):
        constraint, fix = _FIT_REFUSED[name]
        constraint = constraint.replace("`shardfeed.fit`", f"`shardfeed.{fn}`")
        raise TypeError(_errors.message(constraint, received, fix))
    raise TypeError(
        _errors.message(
            f"`shardfeed.{fn}` got an unexpected keyword argument `{name}`.",
            received,
            f"See docs/keras.md for each `model.{fn}` argument and what to use instead.",
        )
    )


def _is_zero(value: Any) -> bool:
    return _errors.is_integer(value) and value == 0


def start(
    call: str,
    model: Any,
    data: Any,
    options: Any,
    dataset_type: type[Any],
    default_world: Callable[[], Any],
) -> None:
    """`evaluate`'s or `predict`'s first collective, on both backends, before
    any other (arrays become a dataset, which compares rows): `start_call`
    with these `settings`, on the dataset's world, or `default_world()` for
    arrays."""
    world = data.world if isinstance(data, dataset_type) else default_world()
    start_call(world, call, lambda: settings(model, data, options, dataset_type))


def settings(model: Any, data: Any, options: Any, dataset_type: type[Any]) -> dict[str, Any]:
    """What decides how many calls and collectives this rank's `evaluate`
    (or `predict`) runs, as the ranks compare it: arrays are built into a dataset (a
    collective: the rows' agreement) where a dataset is not, and a dataset's
    steps and the steps per call give the number of calls. Arrays' rows are
    compared here too: their batch is derived from them, so a difference
    would surface as one in a batch size nobody passed."""
    leaves = [leaf for leaf in optree.tree_leaves(data) if hasattr(leaf, "shape")]
    rows = int(leaves[0].shape[0]) if leaves and len(leaves[0].shape) else None
    given: dict[str, Any] = {"data": "arrays", "data rows": rows}
    if isinstance(data, dataset_type):
        given = {"data": dataset_type.__name__, "data steps": data.eval_plan.steps_per_epoch}
    return {**given, **options_settings(model, options)}
