"""Callbacks under `shardfeed.fit`: which run where, and which are refused.

Owns the `CallbackList` each rank runs (our progress bar added, chief-only
callbacks removed on other ranks). `BackupAndRestore` is replaced by
`backup.ResumableBackup` before the list is built.
"""

from __future__ import annotations

from typing import Any

import keras

from shardfeed._training.progress import Progress

# Callbacks that write files or print: run on the chief (rank 0) only.
_CHIEF_ONLY_CALLBACKS = (
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.CSVLogger,
    keras.callbacks.TensorBoard,
    keras.callbacks.ProgbarLogger,
    Progress,
)


def callback_list(
    callbacks: list[keras.callbacks.Callback] | None,
    model: keras.Model,
    verbose: int,
    is_chief: bool,
    params: dict[str, Any],
) -> keras.callbacks.CallbackList:
    """Keras' `CallbackList` with our progress bar, minus the chief-only
    callbacks on other ranks (a callback with `shardfeed_all_ranks = True`
    runs everywhere). Every rank gets the same global logs, so callbacks that
    decide (EarlyStopping, ReduceLROnPlateau) decide alike on every rank."""
    callbacks = list(callbacks or [])
    if verbose and not any(isinstance(c, Progress) for c in callbacks):
        callbacks.append(Progress(verbose))
    if not is_chief:
        callbacks = [
            c
            for c in callbacks
            if getattr(c, "shardfeed_all_ranks", False) or not isinstance(c, _CHIEF_ONLY_CALLBACKS)
        ]
    return keras.callbacks.CallbackList(
        callbacks, add_history=True, add_progbar=False, model=model, **params
    )
