"""Starting, watching and stopping worker processes (`run_workers`).

Each worker in its own process group, its output tagged line by line, signals
forwarded, exits reaped, one failure turned into stopping the rest (SIGTERM,
`grace_s`, SIGKILL; the failed worker's code). Workers inside TensorFlow's
set-up get SIGKILL (it ignores the others); stalled or missing ranks are named
and stop the launch (exit 124). Every OS call goes through a `System` (tests
pass fakes). Not covered: a child that starts its own session.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from shardfeed._distribute import progress
from shardfeed._launch import lines, stall
from shardfeed._launch.system import StartupWatch, System, WorkerSpec

TIMEOUT_EXIT_CODE = 124  # same as coreutils `timeout`
_MESSAGE_PREFIX = b"shardfeed launch: "
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_READER_JOIN_S = 5.0  # how long to wait for a worker's pipes to drain after it exited
_STACKS_WAIT_S = 2.0  # how long a stop for a stall waits for the workers' stacks
_STACK_LINES = 200  # of each worker's stacks, at most
# Every rank inside one compiled call is a stall only past this many times the
# longest call of that kind that completed (a stuck call and a long one look
# alike from outside: steps per call and row counts set a call's length), and
# past this many `--progress-timeout-s` for a kind's first call, which compiles.
_CALL_LENGTHS_ALLOWED = 3
_FIRST_CALL_TIMEOUTS_ALLOWED = 4


class _BinaryText(io.RawIOBase):
    """Lets a text stream without `.buffer` (e.g. io.StringIO) take bytes."""

    def __init__(self, text: IO[str]) -> None:
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        self._text.flush()


def _binary(stream: IO[bytes] | None, fallback: Any) -> IO[bytes]:
    if stream is not None:
        return stream
    return getattr(fallback, "buffer", None) or _BinaryText(fallback)  # type: ignore[return-value]


def exit_code_of(returncode: int) -> int:
    """Maps a `Popen.returncode` to a shell-style exit code (signal N -> 128 + N).

    Args:
        returncode: As `Popen.returncode`: negative for death by a signal.

    Returns:
        The code a shell would report.

    Example:
        >>> exit_code_of(-9)
        137
    """
    return 128 - returncode if returncode < 0 else returncode


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class _Worker:
    def __init__(self, spec: WorkerSpec, process: Any) -> None:
        self.spec = spec
        self.process = process
        self.returncode: int | None = None
        self.readers: list[threading.Thread] = []

    @property
    def running(self) -> bool:
        return self.returncode is None


class _Supervisor:
    """Runs one set of workers to the end; see `run_workers`."""

    def __init__(
        self,
        system: System,
        grace_s: float,
        timeout_s: float | None,
        startup: StartupWatch | None = None,
    ) -> None:
        self.system = system
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.startup = startup
        self.out = _binary(system.stdout, sys.stdout)
        self.err = _binary(system.stderr, sys.stderr)
        self.out_lock = threading.Lock()
        self.err_lock = self.out_lock if self.out is self.err else threading.Lock()
        self.workers: list[_Worker] = []
        self.signals: list[int] = []
        # The running workers' positions last seen, and since when.
        self.progress: dict[int, progress.Position] = {}
        self.progress_since = 0.0
        # Each rank's current counted call (its count, label) and when it began;
        # the longest completed call of each label, in seconds.
        self.calls_begun: dict[int, tuple[int, str, float]] = {}
        self.longest_call_s: dict[str, float] = {}

    # -- output ---------------------------------------------------------------

    def say(self, text: str) -> None:
        with self.err_lock:
            self.err.write(_MESSAGE_PREFIX + text.encode() + b"\n")
            self.err.flush()

    def _pump(
        self, source: IO[bytes], sink: IO[bytes], lock: threading.Lock, prefix: bytes
    ) -> None:
        try:
            lines.pump(source, sink, lock, prefix)
        except (OSError, ValueError):
            pass  # pipe closed under us during shutdown
        finally:
            try:
                source.close()
            except OSError:
                pass

    # -- starting -------------------------------------------------------------

    def start(self, spec: WorkerSpec) -> None:
        tagged = spec.output_prefix is not None
        process = self.system.popen(
            list(spec.argv),
            env=dict(spec.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if tagged else None,
            stderr=subprocess.PIPE if tagged else None,
            # Own process group: signals reach a worker's whole tree, and
            # terminal Ctrl-C reaches only the launcher, which forwards it once.
            start_new_session=True,
            pass_fds=spec.pass_fds,
        )
        worker = _Worker(spec, process)
        self.workers.append(worker)
        if tagged:
            prefix = spec.output_prefix.encode()  # type: ignore[union-attr]
            for source, sink, lock in (
                (process.stdout, self.out, self.out_lock),
                (process.stderr, self.err, self.err_lock),
            ):
                if source is None:
                    continue
                reader = threading.Thread(
                    target=self._pump, args=(source, sink, lock, prefix), daemon=True
                )
                reader.start()
                worker.readers.append(reader)

    # -- signalling -----------------------------------------------------------

    def signal_group(self, worker: _Worker, signum: int) -> None:
        try:
            self.system.killpg(worker.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def signal_running(self, signum: int) -> int:
        running = [w for w in self.workers if w.running]
        # Inside the set-up the engine's start blocks in native code (TensorFlow
        # holds the GIL with its own SIGTERM handler installed; JAX's client
        # waits for its coordinator): neither SIGTERM nor Python's SIGINT
        # handler can act there.
        deaf = self.in_setup() if signum in _FORWARDED_SIGNALS else set()
        for rank, worker in enumerate(self.workers):
            if worker.running:
                self.signal_group(worker, signal.SIGKILL if rank in deaf else signum)
        if deaf & {r for r, w in enumerate(self.workers) if w.running}:
            ranks = self.rank_names(deaf)
            self.say(
                f"worker rank(s) {ranks} sat in shardfeed.init()'s distributed set-up, where "
                f"{signal.Signals(signum).name} waits until it returns; sent them SIGKILL "
                "instead."
            )
        return len(running)

    def rank_names(self, indexes: set[int]) -> str:
        """The ranks of the workers at `indexes` (they differ on a multi-host job's hosts)."""
        first = 0 if self.startup is None else self.startup.first_rank
        return ", ".join(str(first + i) for i in sorted(indexes))

    def in_setup(self) -> set[int]:
        """Ranks inside `shardfeed.init()`: arrived, not yet initialized."""
        if self.startup is None:
            return set()
        count = len(self.workers)
        return self.startup.ranks("arrived", count) - self.startup.ranks("initialized", count)

    def stalled(self, now: float) -> str | None:
        """Why to stop, when the running workers' positions (progress counts
        and where each stands) stood still `progress_timeout_s` while some
        ranks wait for others, or every rank is inside one call
        (`stall.explain`); else None.
        """
        watch = self.startup
        if watch is None or watch.progress_timeout_s is None:
            return None
        running = [i for i, w in enumerate(self.workers) if w.running]
        positions = watch.positions(running)
        if positions != self.progress:
            self.time_calls(positions, now)
            self.progress, self.progress_since = positions, now
            return None
        bound_s = self.stall_bound_s(positions, watch.progress_timeout_s)
        if now - self.progress_since < bound_s:
            return None
        exiting = {i for i in running if watch.exit_start(i) is not None}
        why = stall.explain(positions, exiting, round(bound_s, 1), self.rank_names)
        if why is None:
            return None
        cause = self.stopped_alone()
        return (
            f"{why}. Stopping {len(running)} worker(s); raise --progress-timeout-s if that "
            "only takes longer (chief-only work such as saving, one long compiled call), or "
            "pass 'none'." + ("" if cause is None else f" The cause: {cause}")
        )

    def time_calls(self, positions: dict[int, progress.Position], now: float) -> None:
        """Records when each rank entered its counted call and, when it left,
        how long that call took (the longest per label)."""
        for i, position in positions.items():
            begun = self.calls_begun.get(i)
            current = (position.calls, position.label)
            if begun is not None and begun[:2] != current:
                label, took = begun[1], now - begun[2]
                self.longest_call_s[label] = max(self.longest_call_s.get(label, 0.0), took)
                del self.calls_begun[i]
            if position.where == progress.IN_CALL and i not in self.calls_begun:
                self.calls_begun[i] = (*current, now)

    def stall_bound_s(self, positions: dict[int, progress.Position], timeout_s: float) -> float:
        """How long positions may stand still: `timeout_s`, except with every
        rank inside one counted call, where a long call is no stall: then
        `_CALL_LENGTHS_ALLOWED` times the longest completed call of its kind,
        at least `timeout_s`; `_FIRST_CALL_TIMEOUTS_ALLOWED` times `timeout_s`
        for a kind's first call (its compile included)."""
        inside = {(p.calls, p.label) for p in positions.values() if p.where == progress.IN_CALL}
        if len(inside) != 1 or len(positions) != sum(
            p.where == progress.IN_CALL for p in positions.values()
        ):
            return timeout_s
        ((_, label),) = inside
        longest = self.longest_call_s.get(label)
        if longest is None:
            return _FIRST_CALL_TIMEOUTS_ALLOWED * timeout_s
        return max(timeout_s, _CALL_LENGTHS_ALLOWED * longest)

    def stopped_alone(self) -> str | None:
        """`stall.stopped_alone` over every worker's last position (an exited
        one's file stays)."""
        if self.startup is None:
            return None
        positions = self.startup.positions(range(len(self.workers)))
        return stall.stopped_alone(positions, self.rank_names)

    def report_stacks(self) -> None:
        """Asks the running workers that finished `shardfeed.init()` for their
        Python stacks (`progress.STACKS_SIGNAL`) and prints them, so a stop
        for a stall says where each rank stood."""
        watch = self.startup
        if watch is None:
            return
        ready = watch.ranks("initialized", len(self.workers))
        asked = [i for i in sorted(ready) if self.workers[i].running]
        for i in asked:
            self.signal_group(self.workers[i], progress.STACKS_SIGNAL)
        stacks: dict[int, str] = {}
        deadline = time.monotonic() + _STACKS_WAIT_S
        while True:
            stacks = {i: watch.stacks(i) for i in asked}
            if all(stacks.values()) or time.monotonic() >= deadline:
                break
            time.sleep(self.system.poll_interval_s)
        for i, text in stacks.items():
            if not text:
                continue
            name = self.rank_names({i})
            self.say(f"Python stacks of worker rank {name} (most recent call first):")
            with self.err_lock:
                for line in text.splitlines()[:_STACK_LINES]:
                    self.err.write(f"[rank {name}] {line}\n".encode())
                self.err.flush()

    def on_signal(self, signum: int, frame: object) -> None:
        # Only record it: the watch loop acts on it between polls.
        self.signals.append(signum)

    # -- watching -------------------------------------------------------------

    def first_to_fail(self, failed: list[_Worker]) -> list[_Worker]:
        """The failed workers of one poll, the one that failed first first.

        Workers write when their exit begins (`StartupWatch.exit_start`); the
        earliest is the cause, the others lost their connection to it. A
        worker that wrote nothing was ended by a signal or `os._exit`, or
        ended before `shardfeed.init()` returned: it goes first (SIGKILL from
        the OOM killer, a segfault), except for SIGABRT, which is how JAX's
        and Gloo's native code end a process whose peer is gone.
        """
        watch = self.startup
        if watch is None or len(failed) < 2:
            return failed

        def order(index: int) -> tuple[int, int]:
            began = watch.exit_start(index)
            if began is not None:
                return (1, began)
            return (2, 0) if self.workers[index].returncode == -signal.SIGABRT else (0, 0)

        indexes = sorted(
            (self.workers.index(w) for w in failed),
            key=lambda i: (order(i), i),
        )
        return [self.workers[i] for i in indexes]

    def reap_exited(self) -> list[_Worker]:
        exited = []
        for worker in self.workers:
            if worker.running and self.system.has_exited(worker.process.pid):
                # The exited leader is still a zombie here, so its group id is
                # still ours: kill what it left behind, then reap it.
                self.signal_group(worker, signal.SIGKILL)
                worker.returncode = worker.process.wait()
                exited.append(worker)
        return exited

    def watch(self) -> int:
        start = time.monotonic()
        exit_code: int | None = None
        stop_deadline: float | None = None  # when SIGKILL follows SIGTERM
        killed = False
        handled_signals = 0
        first_arrival: float | None = None  # when the first worker reached shardfeed.init()
        all_arrived = self.startup is None or self.startup.timeout_s is None
        while True:
            failed = [w for w in self.reap_exited() if w.returncode != 0]
            if exit_code is None and failed:
                # A rank that failed and the peer that lost its connection to
                # it often exit within one poll: report the first to fail, and
                # name every one.
                failed = self.first_to_fail(failed)
                exit_code = exit_code_of(failed[0].returncode)  # type: ignore[arg-type]
                others = sum(w.running for w in self.workers)
                text = " and ".join(
                    f"{w.spec.label} {_describe_exit(w.returncode)}"  # type: ignore[arg-type]
                    for w in failed
                )
                if others:
                    text += f"; stopping the other {others} worker(s)."
                else:
                    text += "."
                self.say(text)
                cause = self.stopped_alone()
                if cause is not None:
                    self.say(f"The cause: {cause}")
                self.signal_running(signal.SIGTERM)
                stop_deadline = time.monotonic() + self.grace_s
            if not any(w.running for w in self.workers):
                return exit_code or 0
            now = time.monotonic()
            while handled_signals < len(self.signals):
                signum = self.signals[handled_signals]
                handled_signals += 1
                name = signal.Signals(signum).name
                if handled_signals == 1:
                    count = self.signal_running(signum)
                    self.say(f"received {name}; forwarding it to {count} worker(s).")
                    if exit_code is None:
                        exit_code = 128 + signum
                    if stop_deadline is None:
                        stop_deadline = now + self.grace_s
                elif not killed:
                    count = self.signal_running(signal.SIGKILL)
                    self.say(f"received {name} again; sending SIGKILL to {count} worker(s).")
                    killed = True
            if self.timeout_s is not None and exit_code is None and now - start >= self.timeout_s:
                count = self.signal_running(signal.SIGTERM)
                self.say(f"timed out after {self.timeout_s:g} s; stopping {count} worker(s).")
                exit_code = TIMEOUT_EXIT_CODE
                stop_deadline = now + self.grace_s
            if not all_arrived and exit_code is None:
                arrived = self.startup.ranks("arrived", len(self.workers))  # type: ignore[union-attr]
                if len(arrived) == len(self.workers):
                    all_arrived = True
                elif arrived and first_arrival is None:
                    first_arrival = now
                elif first_arrival is not None and now - first_arrival >= self.startup.timeout_s:  # type: ignore[union-attr,operator]
                    missing = set(range(len(self.workers))) - arrived
                    self.say(
                        f"worker rank(s) {self.rank_names(missing)} did not reach "
                        f"shardfeed.init() within {self.startup.timeout_s:g} s of the first "  # type: ignore[union-attr]
                        f"worker that did; rank(s) {self.rank_names(arrived)} wait "
                        f"for them in it. Stopping {sum(w.running for w in self.workers)} "
                        "worker(s)."
                    )
                    self.signal_running(signal.SIGTERM)
                    exit_code = TIMEOUT_EXIT_CODE
                    stop_deadline = now + self.grace_s
            stuck = self.stalled(now) if exit_code is None else None
            if stuck is not None:
                self.say(stuck)
                self.report_stacks()
                self.signal_running(signal.SIGTERM)
                exit_code = TIMEOUT_EXIT_CODE
                stop_deadline = now + self.grace_s
            if stop_deadline is not None and not killed and now >= stop_deadline:
                count = self.signal_running(signal.SIGKILL)
                self.say(
                    f"{count} worker(s) still running {self.grace_s:g} s after being asked "
                    "to stop; sending SIGKILL."
                )
                killed = True
            time.sleep(self.system.poll_interval_s)

    def cleanup(self) -> None:
        """Kills and reaps whatever is still running (after an error in the launcher)."""
        for worker in self.workers:
            if worker.running:
                self.signal_group(worker, signal.SIGKILL)
                worker.returncode = worker.process.wait()
        for worker in self.workers:
            for reader in worker.readers:
                reader.join(_READER_JOIN_S)


def run_workers(
    specs: Sequence[WorkerSpec],
    *,
    grace_s: float = 60.0,
    timeout_s: float | None = None,
    system: System | None = None,
    notes: Sequence[str] = (),
    startup: StartupWatch | None = None,
) -> int:
    """Starts `specs`, waits for all of them, and returns the launch's exit code.

    SIGINT and SIGTERM sent to this process are forwarded to every worker's
    process group while the workers run (only when called from the main
    thread, where Python allows installing signal handlers).

    Args:
        specs: The processes to start, in rank order.
        grace_s: Seconds between SIGTERM and SIGKILL when stopping workers.
        timeout_s: Stop everything after this many seconds (None: no limit).
        system: Operating-system calls (default: the real ones).
        notes: Messages to print (prefixed "shardfeed launch: ") before starting.
        startup: Where the workers (rank = index in `specs`) report reaching
            `shardfeed.init()`, and the start-up timeout (None: no reports).

    Returns:
        0 when every worker exited 0; else the first failed worker's exit code
        (128 + N when it died from signal N), 128 + N when this process
        received signal N, or 124 after `timeout_s` or the start-up timeout.

    Raises:
        OSError: If a worker cannot be started (the ones already started are
            killed first).

    Example:
        >>> spec = WorkerSpec("worker rank 0", ("python", "-c", "print(1)"), dict(os.environ),
        ...                   output_prefix="[rank 0] ")
        >>> run_workers([spec], grace_s=5.0)
        [rank 0] 1
        0
    """
    supervisor = _Supervisor(system or System(), grace_s, timeout_s, startup)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}
    try:
        if in_main_thread:
            for signum in _FORWARDED_SIGNALS:
                previous[signum] = signal.signal(signum, supervisor.on_signal)
        for note in notes:
            supervisor.say(note)
        for spec in specs:
            supervisor.start(spec)
        return supervisor.watch()
    finally:
        supervisor.cleanup()
        for forwarded, handler in previous.items():
            # None means a handler installed outside Python; the default is the closest.
            signal.signal(forwarded, signal.SIG_DFL if handler is None else handler)
