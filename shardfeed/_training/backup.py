"""`keras.callbacks.BackupAndRestore` under `fit`, on both backends: mid-epoch, on every rank.

Owns the backup directory: what is written, by whom, and what a restarted
`fit` reads back (`ResumableBackup`, `wrap`). Every rank runs it; only the
chief writes, the weights file in turn and then `shardfeed_state.json` by
rename (naming the weights file and its SHA-256, checked before a restore
loads it), so a kill at any point leaves a state naming a complete weights file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from typing import Any, Protocol

import keras

from shardfeed._common import checked_open as _checked_open
from shardfeed._common import errors as _errors
from shardfeed._common.chief_write import write_on_chief
from shardfeed._training.resume_state import FIX, Cursor, ResumeState

STATE_FILE = "shardfeed_state.json"
WEIGHTS_FILES = ("ckpt-0.weights.h5", "ckpt-1.weights.h5")  # written in turn


class Run(Protocol):
    """What the backup reads of a `fit` call (`epochs.FitRun` on TensorFlow,
    `_jax/training.py`'s run on JAX)."""

    cursor: Cursor
    steps_run: int  # steps run by this fit call, for `save_freq`

    def capture(self) -> ResumeState:
        """The state to save now (every rank calls it)."""
        ...

    def resume(self, state: ResumeState) -> None:
        """Checks `state` against the dataset and world, and starts there."""
        ...


def _file_error(path: str, constraint: str, received: str) -> ValueError:
    return ValueError(
        _errors.message(
            f"A shardfeed backup's {STATE_FILE} {constraint}.",
            f"{path}: {received}",
            FIX,
        )
    )


def read_state_file(
    backup_dir: str,
) -> tuple[ResumeState, tuple[str, str], _checked_open.FileIdentity] | None:
    """A backup's saved resume state, the weights file it names with its
    SHA-256, and that file's identity; None when there is no backup.

    The state file and the weights file it names are opened without
    following links (`checked_open`); the weights file must be one of the
    two names the backup writes, in `backup_dir`. The state is checked field
    by field (`ResumeState.from_dict`); `fit` checks it against the dataset
    and the run (`resume.adapt`).

    Raises:
        ValueError: Naming the file (and the field), for a file that is
            not the JSON the backup writes.
    """
    path = os.path.join(backup_dir, STATE_FILE)
    if not os.path.lexists(path):
        return None
    try:
        with os.fdopen(_checked_open.open_checked(path), "rb") as f:
            raw = f.read()
    except _checked_open.NotTheCheckedFile as err:
        raise _file_error(
            path, "must be a regular file (not a link, FIFO or device)", str(err)
        ) from err
    try:
        saved = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise _file_error(path, "must be UTF-8 JSON", str(err)) from None
    except json.JSONDecodeError as err:
        problem = f"{err.msg}: line {err.lineno} column {err.colno} (char {err.pos})"
        raise _file_error(path, "must be JSON", problem) from None
    if not isinstance(saved, dict) or set(saved) != {"weights", "weights_sha256", "state"}:
        got = f"fields={sorted(saved)}" if isinstance(saved, dict) else (
            f"type={type(saved).__name__}"
        )
        raise _file_error(
            path,
            'must be a JSON object with the fields "weights", "weights_sha256" and "state"',
            got,
        )
    digest = saved["weights_sha256"]
    if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= set(_HEX)):
        raise _file_error(
            path, "must give the weights file's SHA-256 as 64 hex digits",
            f"weights_sha256={digest!r}",
        )
    weights = saved["weights"]
    if weights not in WEIGHTS_FILES:
        raise _file_error(
            path,
            f"must name one of the weights files this backup writes ({WEIGHTS_FILES[0]!r} "
            f"or {WEIGHTS_FILES[1]!r}, in the backup directory)",
            f"weights={weights!r}",
        )
    state = ResumeState.from_dict(saved["state"], source=path)
    weights_path = os.path.join(backup_dir, weights)
    try:
        status = os.lstat(weights_path)
    except OSError as err:
        raise _file_error(path, "must name a weights file that exists", str(err)) from None
    if not stat.S_ISREG(status.st_mode):
        raise _file_error(
            path,
            "must name a regular weights file (not a link, FIFO or device)",
            f"weights={weights!r}: {weights_path} is {_checked_open.kind(status.st_mode)}",
        )
    return state, (weights, digest), _checked_open.identity(status)


_HEX = "0123456789abcdef"


def _copy_hashed(src: Any, dst: Any) -> str:
    """`src` copied to `dst` (None: only read) in 1 MiB pieces; its SHA-256."""
    digest = hashlib.sha256()
    while piece := src.read(1 << 20):
        digest.update(piece)
        if dst is not None:
            dst.write(piece)
    return digest.hexdigest()


class ResumableBackup(keras.callbacks.Callback):
    """Backs up weights, optimizer and resume state; restores them at the start.

    Args:
        source: The user's `keras.callbacks.BackupAndRestore` (its
            `backup_dir`, `save_freq` and `delete_checkpoint` are used).
        run: The `fit` call's run (its cursor and running totals).
        world: The workers (its chief writes the files), either backend's `World`.
    """

    shardfeed_all_ranks = True

    def __init__(self, source: keras.callbacks.BackupAndRestore, run: Run, world: Any) -> None:
        super().__init__()
        self.backup_dir = str(source.backup_dir)
        self.save_freq = source.save_freq
        self.delete_checkpoint = source.delete_checkpoint
        self._run = run
        self._world = world
        self._is_chief = bool(world.is_chief)
        self._saved_at_steps = 0
        self._state_path = os.path.join(self.backup_dir, STATE_FILE)
        self._weights_file: str | None = None
        self._weights_sha256: str | None = None
        self._weights_identity: _checked_open.FileIdentity | None = None
        self.source = source

    # -- the user's object: the state Keras' callback would hold ---------------

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self.source.set_model(model)

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        self.source.set_params(params)

    def _mirror(self, epoch: int, batch: int) -> None:
        self.source._current_epoch = epoch
        self.source._last_batch_seen = batch
        self.source._batches_seen_since_last_saving = self._run.steps_run - self._saved_at_steps

    # -- restore -------------------------------------------------------------

    def read_state(self) -> ResumeState | None:
        """The saved resume state, or None when there is no backup
        (`read_state_file`); remembers the weights file it names."""
        found = read_state_file(self.backup_dir)
        if found is None:
            return None
        state, (self._weights_file, self._weights_sha256), self._weights_identity = found
        return state

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._weights_file is None or self._weights_identity is None:
            return
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        path = os.path.join(self.backup_dir, self._weights_file)
        try:
            fd = _checked_open.open_checked(path, self._weights_identity)
        except _checked_open.NotTheCheckedFile as err:
            raise _file_error(
                self._state_path, "must name the weights file that was checked", f"{path} {err}"
            ) from err
        # Keras loads weights from a path only: a private copy of the open
        # (checked) file, so nothing swapped in at that path is read -- as Keras
        # itself copies a remote file before loading it.
        with tempfile.TemporaryDirectory(prefix="shardfeed-resume-") as tmp:
            copy = os.path.join(tmp, self._weights_file)
            with os.fdopen(fd, "rb") as src, open(copy, "wb") as dst:
                digest = _copy_hashed(src, dst)
            # Flipped bytes inside the weights load: a loss of 1.9e12 or NaN weights.
            if digest != self._weights_sha256:
                raise ValueError(
                    _errors.message(
                        "A shardfeed backup's weights file must be the whole file `fit` "
                        "wrote, for this model.",
                        f"{path}: SHA-256 {digest}, where {STATE_FILE} names "
                        f"{self._weights_sha256}",
                        FIX,
                    )
                )
            try:
                model.load_weights(copy)
            except (OSError, ValueError) as err:
                # h5py's raw "Unable to synchronously open file (truncated file:
                # ...)" named neither the backup nor the fix.
                raise ValueError(
                    _errors.message(
                        "A shardfeed backup's weights file must be the whole file `fit` "
                        "wrote, for this model.",
                        f"{path}: {type(err).__name__}: {err}",
                        FIX,
                    )
                ) from err

    # -- save ----------------------------------------------------------------

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not isinstance(self.save_freq, str) and self.save_freq:
            if self._run.steps_run - self._saved_at_steps >= self.save_freq:
                self._save()
        self._mirror(self._run.cursor.epoch, batch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._mirror(epoch + 1, 0)
        if self.save_freq == "epoch":
            self._save()

    def _save(self) -> None:
        self._saved_at_steps = self._run.steps_run
        state = self._run.capture()  # every rank: metric reads may be collectives
        # The chief writes; every rank learns whether it could (else the others
        # would fail later in a collective the chief never joins).
        write_on_chief(self._world, self.backup_dir, lambda: self._write(state))

    def _write(self, state: ResumeState) -> None:
        os.makedirs(self.backup_dir, exist_ok=True)
        # Two names in turn: the file the current state names is never overwritten.
        name = WEIGHTS_FILES[1] if self._weights_file == WEIGHTS_FILES[0] else WEIGHTS_FILES[0]
        weights_path = os.path.join(self.backup_dir, name)
        self.model.save_weights(weights_path, overwrite=True)
        with open(weights_path, "rb") as f:
            digest = _copy_hashed(f, None)
        tmp = self._state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"weights": name, "weights_sha256": digest, "state": state.to_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._state_path)
        self._weights_file = name
        for old in os.listdir(self.backup_dir):
            if old.startswith("ckpt-") and old != name:
                os.remove(os.path.join(self.backup_dir, old))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._is_chief and self.delete_checkpoint and os.path.exists(self.backup_dir):
            shutil.rmtree(self.backup_dir)


def wrap(
    callbacks: list[keras.callbacks.Callback] | None, run: Run, world: Any
) -> tuple[list[keras.callbacks.Callback], ResumeState | None]:
    """`callbacks` with each `BackupAndRestore` run through a `ResumableBackup`
    (which keeps the user's object's state), and the state of the backup it
    found (None: none), which `fit` hands to `run.resume`.

    Raises:
        TypeError: For a subclass of `BackupAndRestore`.
        ValueError: For more than one `BackupAndRestore`, or a backup that
            cannot resume on this dataset and world (see `resume.adapt`).
    """
    out = list(callbacks or [])
    backups = [i for i, c in enumerate(out) if isinstance(c, keras.callbacks.BackupAndRestore)]
    for i in backups:
        if type(out[i]) is not keras.callbacks.BackupAndRestore:
            raise TypeError(
                _errors.message(
                    "`shardfeed.fit` backs up mid-epoch and on every rank itself, driving a "
                    "`keras.callbacks.BackupAndRestore`'s settings; a subclass's overridden "
                    "methods would not run.",
                    f"type(callback)={type(out[i]).__name__}",
                    "Pass a plain `keras.callbacks.BackupAndRestore(...)` and put your own "
                    "hooks in a separate callback.",
                )
            )
    if len(backups) > 1:
        raise ValueError(
            _errors.message(
                "`shardfeed.fit` takes at most one `BackupAndRestore`: each would restore "
                "its own state.",
                f"{len(backups)} BackupAndRestore callbacks",
                "Keep one (several backups of one run add no safety).",
            )
        )
    state = None
    for i in backups:
        backup = ResumableBackup(out[i], run, world)
        state = backup.read_state()
        out[i] = backup
    return out, state
