"""An authenticated multi-host job on two simulated hosts, with an outsider on their network.

Three network namespaces on one bridge (tests/_helpers_two_hosts.py): hosts
10.231.0.1 and 10.231.0.2 run `shardfeed launch --hosts ... --mtls-dir DIR`
with the job's credentials; a third machine, 10.231.0.3, tries to join the
`jax.distributed` coordinator as process 1 before the real one does, once
without credentials and once with another job's. On JAX >= 0.11.2 both are
turned away and the job ends with the same weights on both hosts; a host
without the credentials is refused naming itself. TensorFlow's workers refuse
credentials they cannot use (its servers have no authentication).
"""

from __future__ import annotations

import os
import subprocess
import sys

import _helpers_two_hosts as hosts
import pytest

from shardfeed._distribute import credentials

pytestmark = [
    pytest.mark.multi_process,
    pytest.mark.skipif(hosts.why_not() is not None, reason=str(hosts.why_not())),
]

ON_JAX = os.environ.get("KERAS_BACKEND") == "jax"
PORT = 23457
TIMEOUT_S = 150
HOST_1_DELAY_S = 8  # the outsider gets there first, as an attacker would


def _jax_has_mtls() -> bool:
    if not ON_JAX:
        return False
    from shardfeed._jax.initialize import has_mtls

    return has_mtls()


needs_mtls = pytest.mark.skipif(
    not _jax_has_mtls(),
    reason="needs Keras on JAX >= 0.11.2 (mutual TLS in jax.distributed): CI's newest-JAX "
    "tier runs it",
)

# Claims process 1 of the job at the coordinator: with the credentials in
# argv[2] ("none": without any).
OUTSIDER = r"""
import sys
import jax
keywords = {}
if sys.argv[2] != "none":
    d = sys.argv[2]
    keywords = dict(mtls_cert_file=f"{d}/worker.pem", mtls_key_file=f"{d}/worker.key",
                    mtls_ca_file=f"{d}/ca.pem", mtls_peer_uri_prefix="spiffe://shardfeed/",
                    verify_secure_credentials=True)
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=1,
                           initialization_timeout=10, **keywords)
print("OUTSIDER JOINED", flush=True)
"""


@needs_mtls
def test_an_outsider_cannot_join_or_stall_an_authenticated_jax_job(tmp_path):
    job = credentials.make_credentials(tmp_path / "job")
    other = credentials.make_credentials(tmp_path / "other-job")
    script = tmp_path / "worker.py"
    script.write_text(hosts.WORKER)
    (tmp_path / "outsider.py").write_text(OUTSIDER)
    outsiders: list[subprocess.Popen[str]] = []

    def on_host(host):
        if host == 0:
            return hosts.launch_on(
                host, "--port-base", str(PORT), "--grace-s", "5", "--timeout-s",
                str(TIMEOUT_S - 10), "--mtls-dir", job.directory, str(script), str(tmp_path / "w"),
            )  # fmt: skip
        # Host 1 runs launch/multihost-launch.sh as written, the credentials in MTLS_DIR.
        recipe = {
            "HOSTS": ",".join(hosts.ADDRESSES), "HOST_INDEX": "1", "NUM_WORKERS": "2",
            "PORT_BASE": str(PORT), "SCRIPT": str(script), "STARTUP_TIMEOUT_S": "60",
            "GRACE_S": "5", "SHARDFEED": " ".join(hosts.LAUNCH[:-1]), "MTLS_DIR": job.directory,
        }  # fmt: skip
        return [
            "sh", "-c", f'sleep {HOST_1_DELAY_S}; exec "$@"', "-",
            "env", *(f"{k}={v}" for k, v in recipe.items()),
            "bash", str(hosts.REPO / "launch" / "multihost-launch.sh"), str(tmp_path / "w"),
        ]  # fmt: skip

    def outsider_tries(workers):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDFEED_", "XLA"))}
        for held in ("none", other.directory):
            outsiders.append(
                subprocess.Popen(
                    two.outsider_argv(
                        [sys.executable, str(tmp_path / "outsider.py"), f"10.231.0.1:{PORT}",
                         held]
                    ),
                    env={**env, "JAX_PLATFORMS": "cpu"},
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                )
            )  # fmt: skip

    try:
        with hosts.two_hosts(outsider=True) as two:
            results = hosts.run_on_hosts(
                two, on_host, PORT, TIMEOUT_S, during=outsider_tries, tf_config=False
            )
            turned_away = [o.communicate(timeout=TIMEOUT_S)[0] for o in outsiders]
    finally:
        for o in outsiders:
            if o.poll() is None:
                o.kill()
                o.communicate()
    assert [rc for rc, _ in results] == [0, 0], "\n---\n".join(o[-3000:] for _, o in results)
    hosts.assert_same_weights(tmp_path / "w")
    for outsider, output in zip(outsiders, turned_away, strict=True):
        assert "OUTSIDER JOINED" not in output
        assert outsider.returncode != 0, output[-2000:]
    assert (
        f"coordinator (process 0 at 10.231.0.1:{PORT}) listens on 10.231.0.1:{PORT} only and "
        "admits only processes holding the job's credentials (mutual TLS)"
    ) in results[0][1], results[0][1][-3000:]
    assert f"the credentials in {job.directory} (mutual TLS)" in results[1][1]


def _launch_alone(tmp_path, host, *options):
    """One host's `shardfeed launch` of the two-host job, the other never
    started (a refusal needs nothing from it): (exit code, output)."""
    script = tmp_path / "worker.py"
    script.write_text(hosts.WORKER)
    launch = hosts.launch_on(
        host, "--port-base", str(PORT), "--grace-s", "5", *options, str(script),
        str(tmp_path / "w"),
    )  # fmt: skip
    with hosts.two_hosts() as two:
        done = subprocess.run(
            two.argv(host, launch),
            env={k: v for k, v in os.environ.items() if not k.startswith("SHARDFEED_")},
            capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
        )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


@needs_mtls
def test_a_host_without_the_credentials_is_refused_naming_it(tmp_path):
    """Host 1 forgot `--mtls-dir`: its worker refuses before joining (host 0 is not
    started: the refusal needs nothing from it)."""
    code, output = _launch_alone(tmp_path, 1)
    assert code == 1, output[-3000:]
    assert (
        "A multi-host `jax.distributed` job authenticates its workers with mutual TLS"
    ) in output
    assert "Received: SHARDFEED_MTLS_DIR unset on host 'sfnode2'" in output


@pytest.mark.tensorflow
def test_tensorflow_workers_refuse_credentials_they_cannot_use(tmp_path):
    job = credentials.make_credentials(tmp_path / "job")
    code, output = _launch_alone(tmp_path, 0, "--mtls-dir", job.directory)
    assert code == 1, output[-3000:]
    assert (
        "TensorFlow's gRPC runtime (MWMS) has no authentication: the job's mutual-TLS "
        "credentials protect only a JAX job's `jax.distributed` coordinator."
    ) in output
