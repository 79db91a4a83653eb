"""Callbacks under `fit` and `evaluate`: which run where, and `History.params`.

The `CallbackList` each rank runs (our progress bar added, chief-only
callbacks removed on other ranks, the rest silenced there), `evaluate`'s
(`evaluation_callback_list`), `fit_params` and `on_chief`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from shardfeed._common import errors as _errors
from shardfeed._distribute import progress as _progress
from shardfeed._training.progress import Progress

# Callbacks that write files or print: run on the chief (rank 0) only.
_CHIEF_ONLY_CALLBACKS = (
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.CSVLogger,
    keras.callbacks.TensorBoard,
    keras.callbacks.ProgbarLogger,
    Progress,
)


def on_chief(callback: keras.callbacks.Callback) -> keras.callbacks.Callback:
    """Marks `callback` to run on the chief (rank 0) only, and returns it.

    For callbacks that write or report (uploading metrics, sending a
    message); the file-writing Keras callbacks (`ModelCheckpoint`,
    `CSVLogger`, `TensorBoard`) are chief-only already. A chief-only callback
    must not start collectives (e.g. call `shardfeed.evaluate`): the other
    ranks would not join them.

    Args:
        callback: Any Keras callback.

    Returns:
        The same callback, marked.

    Raises:
        TypeError: If `callback` is not a `keras.callbacks.Callback`.

    Example:
        >>> shardfeed.fit(model, ds, callbacks=[shardfeed.on_chief(MyUploader())])
    """
    if not isinstance(callback, keras.callbacks.Callback):
        raise TypeError(
            _errors.message(
                "`on_chief` takes a Keras callback.",
                f"type(callback)={type(callback).__name__}",
                "Pass an instance of a `keras.callbacks.Callback` subclass.",
            )
        )
    callback.shardfeed_chief_only = True
    callback.shardfeed_all_ranks = False
    return callback


def _runs_here(callback: keras.callbacks.Callback, is_chief: bool) -> bool:
    if is_chief:
        return True
    if getattr(callback, "shardfeed_chief_only", False):
        return False
    return getattr(callback, "shardfeed_all_ranks", False) or not isinstance(
        callback, _CHIEF_ONLY_CALLBACKS
    )


class _RestoreVerbose(keras.callbacks.Callback):
    """Gives the callbacks silenced on a non-chief rank their `verbose` back."""

    def __init__(self, saved: list[tuple[keras.callbacks.Callback, Any]]) -> None:
        super().__init__()
        self.saved = saved

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        for callback, verbose in self.saved:
            callback.verbose = verbose


def _silence(callbacks: list[keras.callbacks.Callback]) -> list[keras.callbacks.Callback]:
    """Sets `verbose=0` on the callbacks that print (`LearningRateScheduler`,
    `ReduceLROnPlateau`, `EarlyStopping`), for the rest of `fit`: they still
    act on every rank, and print on the chief only. Callbacks marked
    `shardfeed_all_ranks` are left as they are."""
    saved = [
        (c, c.verbose)
        for c in callbacks
        if getattr(c, "verbose", 0) not in (0, None) and not getattr(c, "shardfeed_all_ranks", 0)
    ]
    for callback, _ in saved:
        callback.verbose = 0
    return [_RestoreVerbose(saved)] if saved else []


def fit_params(
    plan: Any,
    *,
    epochs: int,
    steps: int,
    verbose: int,
    steps_per_call: Callable[[int], int],
    jit_compile: bool,
) -> dict[str, Any]:
    """`History.params` of a `fit` (what Keras' `fit` puts there, and the
    plan: global batch, replicas, rows used and dropped per epoch).

    Args:
        plan: The training plan (a resume's, when one resumes).
        epochs: The epochs to run.
        steps: The steps of one epoch, as Keras' `params["steps"]`.
        verbose: The resolved `verbose`.
        steps_per_call: The loop's steps per compiled call for a given
            number of full steps.
        jit_compile: Whether the steps run compiled.
    """
    full = plan.full_steps_per_epoch
    return {
        "epochs": epochs,
        "steps": steps,
        "verbose": verbose,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "num_replicas_in_sync": plan.num_replicas,
        "samples": plan.used_rows_per_epoch,
        "dropped_rows_per_epoch": plan.dropped_rows_per_epoch,
        "steps_per_execution": steps_per_call(full) if full else 1,
        "jit_compile": jit_compile,
    }


class _Watched(keras.callbacks.CallbackList):
    """Keras' `CallbackList` that tells `shardfeed launch`'s progress watch
    which hook it is in (a rank stuck in a callback while the others wait in
    shardfeed's next collective is named as such), and when a hook set
    `model.stop_training` (a rank that stops alone is named)."""


_MAY_STOP = ("on_train_batch_end", "on_epoch_end")  # `fit` checks `stop_training` after them


def _watched(hook: str) -> Callable[..., Any]:
    def run(self: _Watched, *args: Any, **kwargs: Any) -> Any:
        if hook == "on_train_begin":
            _progress.record_stop(False)
        with _progress.in_callback(hook):
            result = getattr(keras.callbacks.CallbackList, hook)(self, *args, **kwargs)
        if hook in _MAY_STOP and getattr(self.model, "stop_training", False):
            _progress.record_stop(True)  # `fit` leaves its loop here
        return result

    run.__name__ = hook
    return run


for _hook in (
    "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
    "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
    "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
    "on_predict_batch_begin", "on_predict_batch_end",
):  # fmt: skip
    setattr(_Watched, _hook, _watched(_hook))


def callback_list(
    callbacks: list[keras.callbacks.Callback] | None,
    model: keras.Model,
    verbose: int,
    is_chief: bool,
    params: dict[str, Any],
) -> keras.callbacks.CallbackList:
    """Keras' `CallbackList` with our progress bar, minus the chief-only
    callbacks on other ranks (a callback with `shardfeed_all_ranks = True`
    runs everywhere, one passed through `on_chief` on rank 0 only), and the
    rest silenced there (`verbose=0` until `on_train_end`). Every rank gets
    the same global logs, so callbacks that decide (EarlyStopping,
    ReduceLROnPlateau) decide alike on every rank."""
    callbacks = list(callbacks or [])
    if verbose and not any(isinstance(c, Progress) for c in callbacks):
        callbacks.append(Progress(verbose))
    callbacks = [c for c in callbacks if _runs_here(c, is_chief)]
    if not is_chief:
        callbacks += _silence(callbacks)
    return _Watched(callbacks, add_history=True, add_progbar=False, model=model, **params)


def evaluation_callback_list(
    callbacks: list[keras.callbacks.Callback] | None, model: keras.Model, verbose: int, dataset: Any
) -> keras.callbacks.CallbackList:
    """`evaluate`'s callbacks with Keras' own progress bar, in its evaluation
    mode, on rank 0 only (`dataset`: the one evaluated, for its steps)."""
    return _Watched(
        callbacks,
        add_progbar=bool(verbose) and dataset.world.is_chief,
        model=model,
        verbose=verbose,
        epochs=1,
        steps=dataset.eval_plan.steps_per_epoch,
    )
