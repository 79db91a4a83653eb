"""Start-up, on both backends: a bounded wait for peers, the exposure line, `init`'s settings.

`wait_for_peers`: TensorFlow's multi-worker set-up waits for every peer without
a bound, holding the GIL and ignoring SIGTERM, so `init` first waits here, where
SIGTERM still works, and names the peers that never answered. Also
`exposure_line`, the start-up timeouts, `cpu_devices_wanted` and
`keeping_sigterm_disposition`.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from shardfeed._common import errors as _errors
from shardfeed._common.host import is_loopback

CPU_DEVICES_ENV = "SHARDFEED_CPU_DEVICES"


def cpu_devices_wanted(cpu_devices: int | None, environ: Mapping[str, str]) -> int | None:
    """How many logical devices to split the CPU into: `cpu_devices`, else
    `SHARDFEED_CPU_DEVICES`, else None (leave the backend's configuration).
    Pure, so every rule is tested with plain values; both backends' `init`
    read it.

    Raises:
        ValueError: For anything but an integer >= 1.
    """
    if cpu_devices is not None:
        received = f"cpu_devices={cpu_devices!r}"
        wanted = int(cpu_devices) if _errors.is_integer(cpu_devices) else 0
    else:
        text = environ.get(CPU_DEVICES_ENV, "").strip()
        if not text:
            return None
        received = f"{CPU_DEVICES_ENV}={text!r}"
        wanted = int(text) if text.isdigit() else 0
    if wanted < 1:
        raise ValueError(
            _errors.message(
                "`cpu_devices` must be an integer >= 1: the number of logical devices "
                "to split the CPU into (several replicas in one process).",
                received,
                "Pass e.g. `shardfeed.init(cpu_devices=2)` or set SHARDFEED_CPU_DEVICES=2.",
            )
        )
    return wanted


STARTUP_TIMEOUT_VARIABLE = "SHARDFEED_STARTUP_TIMEOUT_S"
DEFAULT_STARTUP_TIMEOUT_S = 300.0  # as `shardfeed launch --startup-timeout-s`
# JAX only (`jax.distributed`'s own defaults are 300 s and 100 s): how long an
# exiting rank waits at the exit barrier for the others, and how long a rank
# may send no heartbeat before the coordinator declares it dead.
SHUTDOWN_TIMEOUT_VARIABLE = "SHARDFEED_SHUTDOWN_TIMEOUT_S"
DEFAULT_SHUTDOWN_TIMEOUT_S = 60.0
HEARTBEAT_TIMEOUT_VARIABLE = "SHARDFEED_HEARTBEAT_TIMEOUT_S"
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
_POLL_S = 0.2


def timeout_s(
    value: float | None,
    environ: Mapping[str, str],
    *,
    option: str,
    variable: str,
    default: float,
) -> float:
    """A timeout of `shardfeed.init`: `value`, else `environ[variable]`, else `default`.

    `math.inf` (or the variable set to "none") waits without a bound. Pure,
    so every rule is tested with plain values.

    Raises:
        ValueError: If either is not a positive number of seconds, naming
            `option` and `variable`.
    """
    if value is None:
        text = environ.get(variable, "").strip()
        if not text:
            return default
        try:
            value = math.inf if text.lower() == "none" else float(text)
        except ValueError:
            value = math.nan
        received = f"{variable}={text!r}"
    else:
        received = f"{option}={value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(
            _errors.message(
                f"`{option}` must be a positive number of seconds (math.inf, or "
                '"none" in the variable, waits without a bound).',
                received,
                f"Pass e.g. `shardfeed.init({option}={default * 2:g})` or set "
                f"{variable}={default * 2:g}.",
            )
        )
    return float(value)


def startup_timeout_s(value: float | None, environ: Mapping[str, str]) -> float:
    """The start-up timeout: `value`, else SHARDFEED_STARTUP_TIMEOUT_S, else 300 s.

    `math.inf` (or the variable set to "none") waits without a bound.

    Raises:
        ValueError: If either is not a positive number of seconds.
    """
    return timeout_s(
        value,
        environ,
        option="startup_timeout_s",
        variable=STARTUP_TIMEOUT_VARIABLE,
        default=DEFAULT_STARTUP_TIMEOUT_S,
    )


def cluster_tasks(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """`(task name, "host:port")` of every chief and worker in TF_CONFIG, chief first.

    The index in the list is the rank `detect_launch_env` gives. Empty without
    a cluster. Assumes a TF_CONFIG `detect_launch_env` has accepted.
    """
    text = environ.get("TF_CONFIG", "").strip()
    cluster = json.loads(text).get("cluster", {}) if text else {}
    return [
        (f"{job} {index}", str(address))
        for job in ("chief", "worker")
        for index, address in enumerate(cluster.get(job, ()))
    ]


def _split(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    if not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def exposure_line(tasks: Sequence[tuple[str, str]]) -> str | None:
    """The line a chief logs when the cluster names any non-loopback host, else None."""
    if all(is_loopback((_split(a) or (a, 0))[0]) for _, a in tasks):
        return None
    addresses = ", ".join(f"{name} at {address}" for name, address in tasks)
    return (
        "shardfeed: this multi-host job's TensorFlow servers listen on every interface of their "
        f"hosts (port of each: {addresses}) and are unauthenticated: whoever reaches a port can "
        "run operations on that worker. Keep the hosts on a trusted network, or firewall these "
        "ports from everyone but the other workers (docs/engines.md, Security)."
    )


def _answers(address: tuple[str, int], timeout_s: float) -> str | None:
    """None when `address` accepts a TCP connection, else why not."""
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return None
    except socket.gaierror as err:
        return f"name does not resolve: {err.strerror}"
    except TimeoutError:
        return "no answer (timed out)"
    except OSError as err:
        return err.strerror or type(err).__name__


def _hold_port(port: int) -> socket.socket | None:
    """A listening socket on `port` (every interface, as TensorFlow binds), or None."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("", port))
        holder.listen(128)  # the kernel completes peers' connects; nothing accepts
    except OSError:
        holder.close()
        return None  # TensorFlow reports a port it cannot bind itself
    return holder


def wait_for_peers(
    tasks: Sequence[tuple[str, str]],
    rank: int,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Returns once every other task's port has accepted a connection.

    Meanwhile this task's own port accepts connections, so the peers doing
    the same see it. Each peer needs to answer once: after that it is in (or
    about to start) TensorFlow's set-up, whose server takes over its port.

    Raises:
        TimeoutError: Naming the tasks that never answered, and why.
    """
    own = _split(tasks[rank][1])
    holder = _hold_port(own[1]) if own is not None else None
    try:
        waiting = {
            name: parsed
            for index, (name, address) in enumerate(tasks)
            if index != rank and (parsed := _split(address)) is not None
        }
        reasons: dict[str, str] = {}
        deadline = clock() + timeout_s
        while waiting:
            for name, address in list(waiting.items()):
                reason = _answers(address, min(1.0, max(0.05, deadline - clock())))
                if reason is None:
                    del waiting[name]
                else:
                    reasons[name] = reason
            if not waiting:
                break
            if clock() >= deadline:
                missing = "; ".join(
                    f"{name} at {dict(tasks)[name]} ({reasons[name]})" for name in waiting
                )
                raise TimeoutError(
                    _errors.message(
                        f"Every task in TF_CONFIG must start within the start-up timeout: "
                        f"{tasks[rank][0]} waited {timeout_s:g} s and these never answered, so "
                        "TensorFlow's set-up would wait for them (deaf to SIGTERM).",
                        f"startup_timeout_s={timeout_s:g}; never answered: {missing}",
                        "Start those tasks (same TF_CONFIG cluster, their own task index), check "
                        "that this host reaches their addresses (name, route, firewall), or "
                        f"raise the timeout: `shardfeed.init(startup_timeout_s=...)` or "
                        f"{STARTUP_TIMEOUT_VARIABLE}.",
                    )
                )
            sleep(_POLL_S)
    finally:
        if holder is not None:
            holder.close()


@contextlib.contextmanager
def keeping_sigterm_disposition() -> Iterator[None]:
    """Puts back the SIGTERM disposition Python knew of before the block.

    MultiWorkerMirroredStrategy and `jax.distributed.initialize` both install
    a native SIGTERM handler (preemption watching) behind Python's back
    (`signal.getsignal` still reports the old value), after which SIGTERM no
    longer ends the process; re-setting the old value is what undoes it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # Python sets handlers only from the main thread
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        # None: a handler set outside Python before we looked; the default
        # (end the process) is what a stopping launcher expects.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
