"""Which TF_CONFIG peer a collective failure is about, in words: `lost_peer_message` turns
the coordination service's unhealthy-task or heartbeat errors into the task's name,
address and rank; `naming_lost_peers` re-raises `fit`/`evaluate`/`predict`'s error with it."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shardfeed._common import errors as _errors
from shardfeed._distribute import startup as _startup

_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
_UNHEALTHY = "stopped sending heartbeats"
_HEARTBEAT_RPC = "CoordinationService/Heartbeat"

F = TypeVar("F", bound=Callable[..., Any])


def lost_peer_message(text: str, environ: Mapping[str, str]) -> str | None:
    """The error naming the peer(s) TensorFlow lost, or None when `text` is not about one."""
    tasks = _startup.cluster_tasks(environ)
    if not tasks:
        return None
    if _UNHEALTHY in text:
        lost = [f"{job} {index}" for job, index in _TASK.findall(text.split(_UNHEALTHY, 1)[1])]
        what = "stopped sending heartbeats to the coordination service (which runs here)"
        evidence = "The following tasks are unhealthy (stopped sending heartbeats)"
    elif _HEARTBEAT_RPC in text:
        lost = [tasks[0][0]]  # MultiWorkerMirroredStrategy's coordination service leader
        what = "stopped answering this worker's heartbeats (it runs the coordination service)"
        evidence = "RPC /tensorflow.CoordinationService/Heartbeat failed"
    else:
        return None
    ranks = {name: rank for rank, (name, _) in enumerate(tasks)}
    addresses = dict(tasks)
    named = ", ".join(
        f"{name} at {addresses[name]} (rank {ranks[name]})" for name in lost if name in ranks
    )
    if not named:
        return None
    return _errors.message(
        f"Lost contact with {named}: it {what}. The link between the hosts was cut, or that "
        "worker crashed or was stopped.",
        f"TensorFlow: {evidence} ('The tasks have crashed')",
        "Check that worker's log and the network between this host and it, then restart the "
        "job (with `keras.callbacks.BackupAndRestore` it resumes where it stopped).",
    )


def naming_lost_peers(function: F) -> F:
    """Re-raises a TensorFlow error about a lost peer as the same type, naming the peer."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as err:
            import tensorflow as tf

            if not isinstance(err, tf.errors.OpError):
                raise
            text = lost_peer_message(str(err.message), os.environ)
            if text is None:
                raise
            try:
                named = type(err)(err.node_def, err.op, text)
            except TypeError:  # the base class also takes the code
                named = tf.errors.OpError(err.node_def, err.op, text, err.error_code)
            raise named from err

    return wrapper  # type: ignore[return-value]
