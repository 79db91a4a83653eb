"""`shardfeed.init()` outside the launcher: a bounded wait for peers, SIGTERM, the exposure line.

A worker gets a hand-written TF_CONFIG whose peer never starts. Before the fix
it sat 40+ s in TensorFlow's set-up, deaf to SIGTERM; now it waits in Python
(SIGTERM ends it) and its timeout names the peer. Every process is reaped.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardfeed._common.host import is_loopback
from shardfeed._common.ports import free_port
from shardfeed._distribute import startup

REPO = Path(__file__).resolve().parents[2]

WORKER = "import shardfeed\nshardfeed.init()\nprint('INITIALIZED', flush=True)\n"


def _tf_config(rank: int, addresses: list[str]) -> str:
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}})


def _start_worker(tf_config: str, **extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDFEED_", "OMPI_", "PMI"))}
    env.update(TF_CONFIG=tf_config, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), **extra)
    return subprocess.Popen(
        [sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )


def _listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


@pytest.mark.multi_process
@pytest.mark.tensorflow
def test_sigterm_while_waiting_for_a_peer_ends_the_worker_promptly():
    ports = [free_port(), free_port()]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    worker = _start_worker(_tf_config(0, addresses), SHARDFEED_STARTUP_TIMEOUT_S="120")
    try:
        deadline = time.monotonic() + 120
        # Its port listens once it waits for the peer (before the fix: once
        # TensorFlow's set-up runs, with TensorFlow's SIGTERM handler).
        while not _listening(ports[0]):
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker never opened its port"
            time.sleep(0.1)
        time.sleep(1.0)
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=10)
        assert time.monotonic() - sent < 5
        assert worker.returncode == -signal.SIGTERM
    finally:
        worker.kill()
        worker.communicate()


@pytest.mark.multi_process
@pytest.mark.tensorflow
def test_peer_that_never_starts_is_named_after_the_startup_timeout():
    ports = [free_port(), free_port()]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    worker = _start_worker(_tf_config(1, addresses), SHARDFEED_STARTUP_TIMEOUT_S="3")
    try:
        _, stderr = worker.communicate(timeout=90)  # before the fix: TensorFlow's long wait
    finally:
        worker.kill()
        worker.communicate()
    assert worker.returncode == 1, stderr[-3000:]
    assert "TimeoutError: Every task in TF_CONFIG must start within the start-up timeout" in stderr
    assert f"never answered: worker 0 at {addresses[0]} (Connection refused)" in stderr
    assert "startup_timeout_s=3;" in stderr and "SHARDFEED_STARTUP_TIMEOUT_S" in stderr


def test_wait_for_peers_returns_once_every_peer_answered():
    with socket.create_server(("127.0.0.1", 0)) as peer:
        port = peer.getsockname()[1]
        own = free_port()
        startup.wait_for_peers(
            [("worker 0", f"127.0.0.1:{own}"), ("worker 1", f"127.0.0.1:{port}")], 0, 5.0
        )


def test_wait_for_peers_names_unresolvable_hosts():
    clock = iter([0.0, 0.0, 10.0, 10.0, 10.0])
    with pytest.raises(TimeoutError, match=r"worker 1 at no-such-host\.invalid:2222 \(name does "):
        startup.wait_for_peers(
            [("worker 0", f"127.0.0.1:{free_port()}"), ("worker 1", "no-such-host.invalid:2222")],
            0, 5.0, clock=lambda: next(clock), sleep=lambda s: None,
        )


@pytest.mark.parametrize(
    "value, environ, expected",
    [
        (None, {}, 300.0),  # the default, as `shardfeed launch`
        (None, {"SHARDFEED_STARTUP_TIMEOUT_S": "12.5"}, 12.5),
        (None, {"SHARDFEED_STARTUP_TIMEOUT_S": "none"}, math.inf),
        (7, {"SHARDFEED_STARTUP_TIMEOUT_S": "12.5"}, 7.0),  # the argument wins
    ],
)
def test_startup_timeout_sources(value, environ, expected):
    assert startup.startup_timeout_s(value, environ) == expected


@pytest.mark.parametrize(
    "value, environ, received",
    [
        (0, {}, "startup_timeout_s=0"),
        (-1.0, {}, "startup_timeout_s=-1.0"),
        (math.nan, {}, "startup_timeout_s=nan"),
        (None, {"SHARDFEED_STARTUP_TIMEOUT_S": "soon"}, "SHARDFEED_STARTUP_TIMEOUT_S='soon'"),
    ],
)
def test_bad_startup_timeout_is_refused(value, environ, received):
    with pytest.raises(ValueError, match="Received: " + received.replace(".", r"\.")):
        startup.startup_timeout_s(value, environ)


def test_exposure_line_only_for_non_loopback_clusters():
    loopback = [("worker 0", "127.0.0.1:2222"), ("worker 1", "localhost:2223")]
    assert startup.exposure_line(loopback) is None
    line = startup.exposure_line([("worker 0", "10.231.0.1:2222"), ("worker 1", "10.231.0.2:2222")])
    assert line is not None
    assert "listen on every interface" in line and "unauthenticated" in line
    assert "worker 0 at 10.231.0.1:2222, worker 1 at 10.231.0.2:2222" in line


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),  # all of 127.0.0.0/8
        ("127.255.255.254", True),
        ("::1", True),
        ("[::1]", True),  # as in "[::1]:2222"
        ("0:0:0:0:0:0:0:1", True),
        ("::ffff:127.0.0.1", True),  # IPv4-mapped: Python 3.11's is_loopback says no
        ("localhost", True),
        ("LocalHost", True),  # names are case-blind
        ("localhost.", True),  # the root's trailing dot
        (" localhost ", True),
        ("10.0.0.1", False),
        ("::", False),  # the wildcard is every interface
        ("0.0.0.0", False),
        ("::ffff:10.0.0.1", False),
        ("128.0.0.1", False),
        ("127.example.org", False),  # a name that looks like an address
        ("localhost.example.org", False),
        ("a.localhost", False),  # loopback only where the resolver follows RFC 6761
        ("my-host", False),  # names are never resolved (Debian maps its own to 127.0.1.1)
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_exposure_line_warns_for_a_name_that_only_looks_like_loopback():
    # Was silenced: the rule here took every host starting "127." for loopback.
    line = startup.exposure_line([("worker 0", "127.example.org:2222"), ("worker 1", "[::1]:2223")])
    assert line is not None and "worker 0 at 127.example.org:2222" in line
    assert startup.exposure_line([("worker 0", "[::1]:2222"), ("worker 1", "LOCALHOST:1")]) is None


def test_cluster_tasks_count_the_chief_first():
    config = {"cluster": {"worker": ["b:2"], "chief": ["a:1"]}, "task": {"type": "worker"}}
    assert startup.cluster_tasks({"TF_CONFIG": json.dumps(config)}) == [
        ("chief 0", "a:1"), ("worker 0", "b:2")
    ]
    assert startup.cluster_tasks({}) == []

