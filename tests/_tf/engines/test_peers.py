"""A lost peer (a cut link, a dead worker) is named with its TF_CONFIG address.

Before: TensorFlow's "The tasks have crashed" and a task path, nothing else.

The two texts are what TensorFlow 2.21 printed when the veth link between two
simulated hosts was cut mid-epoch (tests/_launch/test_two_hosts.py cuts it for real).
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from shardfeed._tf.engines import peers

ADDRESSES = ["10.231.0.1:23456", "10.231.0.2:23456"]
ENV = {"TF_CONFIG": json.dumps({"cluster": {"worker": ADDRESSES}, "task": {"type": "worker"}})}

ON_THE_SERVICE = (
    "Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks "
    "are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\nThe tasks have "
    "crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, "
    "eviction) to debug further."
)
ON_THE_OTHERS = (
    "Collective ops is aborted by: Deadline Exceeded\n\nRPC: "
    "/tensorflow.CoordinationService/Heartbeat\nThe error could be from a previous operation."
)


def test_the_unhealthy_task_is_named_with_its_address():
    text = peers.lost_peer_message(ON_THE_SERVICE, ENV)
    assert text is not None
    assert text.startswith(
        "Lost contact with worker 1 at 10.231.0.2:23456 (rank 1): it stopped sending heartbeats"
    )
    assert "The link between the hosts was cut, or that worker crashed or was stopped." in text
    assert "Received: TensorFlow: The following tasks are unhealthy" in text


def test_a_lost_coordination_service_names_its_task():
    text = peers.lost_peer_message(ON_THE_OTHERS, ENV)
    assert text is not None
    assert text.startswith("Lost contact with worker 0 at 10.231.0.1:23456 (rank 0): it stopped")


@pytest.mark.parametrize(
    "text, environ",
    [
        ("Collective ops is aborted by: Socket closed", ENV),  # not about heartbeats
        (ON_THE_SERVICE, {}),  # no TF_CONFIG cluster: nothing to name
    ],
)
def test_other_errors_are_left_alone(text, environ):
    assert peers.lost_peer_message(text, environ) is None


def test_the_error_keeps_its_type(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", ENV["TF_CONFIG"])

    @peers.naming_lost_peers
    def step():
        raise tf.errors.UnavailableError(None, None, ON_THE_SERVICE)

    lost = r"^Lost contact with worker 1 at "
    with pytest.raises(tf.errors.UnavailableError, match=lost) as info:
        step()
    assert isinstance(info.value.__cause__, tf.errors.UnavailableError)
