"""A multi-host job's mutual-TLS credentials: made, checked, and the rule each worker applies.

Backend-neutral (the JAX tier runs it too). The jobs that use them, on two
simulated hosts with an outsider, are in tests/_launch/test_mtls_hosts.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed import _launch
from shardfeed._commands import cli as commands
from shardfeed._distribute import credentials

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="making credentials needs the openssl program",
)
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return credentials.make_credentials(tmp_path_factory.mktemp("job") / "creds")


def test_made_credentials_are_one_ca_and_one_worker_certificate_it_signed(made):
    directory = Path(made.directory)
    assert sorted(p.name for p in directory.iterdir()) == ["ca.pem", "worker.key", "worker.pem"]
    # Nobody can sign another worker's certificate: the CA's key is gone.
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in ("ca.pem", "worker.key", "worker.pem"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", made.ca_file, made.cert_file],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", made.cert_file, "-noout", "-text"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "URI:spiffe://shardfeed/worker" in text
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in text
    assert made.jax_keywords() == {
        "mtls_cert_file": made.cert_file,
        "mtls_key_file": made.key_file,
        "mtls_ca_file": made.ca_file,
        "mtls_peer_uri_prefix": "spiffe://shardfeed/",
        "verify_secure_credentials": True,
    }


def test_two_jobs_credentials_do_not_trust_each_other(made, tmp_path):
    other = credentials.make_credentials(tmp_path / "other")
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", made.ca_file, other.cert_file],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert verified.returncode != 0


def test_existing_credentials_are_never_overwritten(made):
    with pytest.raises(FileExistsError) as caught:
        credentials.make_credentials(made.directory)
    assert str(caught.value) == (
        "`shardfeed credentials` writes a new directory and never overwrites one. Received: "
        f"directory={made.directory!r} (exists). Name a directory that does not exist yet; "
        "every job gets its own."
    )


def test_a_missing_file_is_named_with_this_host(made, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "ca.pem").write_bytes(Path(made.ca_file).read_bytes())
    with pytest.raises(FileNotFoundError) as caught:
        credentials.load_credentials(partial)
    assert str(caught.value) == (
        "A multi-host job's credentials directory must hold ca.pem, worker.pem and worker.key on "
        f"every host. Received: SHARDFEED_MTLS_DIR={str(partial)!r} on host {HOST!r}, missing: "
        f"{partial / 'worker.pem'}, {partial / 'worker.key'}. Make a job's credentials once "
        "with `shardfeed credentials DIR`, put DIR on every host (a shared file system, or copy "
        "it), and pass `--mtls-dir DIR` to `shardfeed launch` on every host (srun, mpirun: "
        "export SHARDFEED_MTLS_DIR=DIR)."
    )


def test_a_key_others_can_read_is_refused(made, tmp_path):
    copy = Path(shutil.copytree(made.directory, tmp_path / "copy"))
    os.chmod(copy / "worker.key", 0o644)
    with pytest.raises(PermissionError) as caught:
        credentials.load_credentials(copy)
    assert str(caught.value) == (
        "The credentials' private key must be readable by its owner only: whoever reads it can "
        f"join the job. Received: {copy / 'worker.key'} on host {HOST!r} with mode -rw-r--r--. "
        f"Run `chmod 600 {copy / 'worker.key'}` (and keep the directory 0700)."
    )
    os.chmod(copy / "worker.key", 0o600)
    assert credentials.load_credentials(copy).key_file == str(copy / "worker.key")


@pytest.mark.parametrize(
    ("loopback", "given", "insecure_ok", "has_mtls", "expected"),
    [
        (True, False, False, True, "loopback"),  # bound to 127.0.0.1: nothing else reaches it
        (True, True, False, True, "mtls"),  # given: used, also on one host
        (False, True, False, True, "mtls"),
        (False, False, True, True, "insecure"),  # the user accepted it
        (False, False, False, False, "insecure"),  # JAX 0.10: no mTLS to ask for (fenced, said)
        (False, False, True, False, "insecure"),
    ],
)
def test_what_a_jax_coordinator_uses(loopback, given, insecure_ok, has_mtls, expected):
    assert (
        credentials.network_security(
            loopback=loopback,
            credentials_given=given,
            insecure_ok=insecure_ok,
            engine_has_mtls=has_mtls,
            engine="jax==0.12.0",
        )
        == expected
    )


def test_a_multi_host_job_without_credentials_is_refused_where_jax_has_mtls():
    with pytest.raises(ValueError) as caught:
        credentials.network_security(
            loopback=False, credentials_given=False, insecure_ok=False, engine_has_mtls=True,
            engine="jax==0.12.0",
        )  # fmt: skip
    assert str(caught.value) == (
        "A multi-host `jax.distributed` job authenticates its workers with mutual TLS (JAX >= "
        "0.11.2): without it, anyone who reaches the coordinator's port can join or stall the "
        f"job. Received: SHARDFEED_MTLS_DIR unset on host {HOST!r}, jax==0.12.0. Make a job's "
        "credentials once with `shardfeed credentials DIR`, put DIR on every host (a shared file "
        "system, or copy it), and pass `--mtls-dir DIR` to `shardfeed launch` on every host "
        "(srun, mpirun: export SHARDFEED_MTLS_DIR=DIR). On a network you trust, pass "
        "`--insecure-network` instead (SHARDFEED_INSECURE_NETWORK=1)."
    )


def test_credentials_for_a_jax_without_mtls_are_refused():
    with pytest.raises(ValueError, match=r"Mutual TLS for `jax.distributed` needs JAX >= 0.11.2"):
        credentials.network_security(
            loopback=False, credentials_given=True, insecure_ok=False, engine_has_mtls=False,
            engine="jax==0.10.2",
        )  # fmt: skip


def test_a_misspelt_insecure_switch_is_refused_not_read_as_yes():
    assert credentials.insecure_network_ok({}) is False
    assert credentials.insecure_network_ok({"SHARDFEED_INSECURE_NETWORK": "1"}) is True
    with pytest.raises(ValueError, match=r"Received: SHARDFEED_INSECURE_NETWORK='yes'"):
        credentials.insecure_network_ok({"SHARDFEED_INSECURE_NETWORK": "yes"})


def test_tensorflow_and_horovod_refuse_credentials_they_cannot_use():
    credentials.refuse_credentials_without_mtls({}, "Horovod")
    with pytest.raises(ValueError) as caught:
        credentials.refuse_credentials_without_mtls({"SHARDFEED_MTLS_DIR": "/c"}, "Horovod")
    assert str(caught.value) == (
        "Horovod has no authentication: the job's mutual-TLS credentials protect only a JAX "
        "job's `jax.distributed` coordinator. Received: SHARDFEED_MTLS_DIR='/c' (`--mtls-dir`), "
        "Horovod. Drop `--mtls-dir` and fence the workers' ports to the job's hosts "
        "(docs/engines.md, Security), or run the job on the JAX backend (KERAS_BACKEND=jax, JAX "
        ">= 0.11.2)."
    )


def test_the_launcher_checks_the_credentials_before_starting_any_worker(tmp_path, made):
    script = tmp_path / "never.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    with pytest.raises(FileNotFoundError, match=r"missing: .*ca\.pem"):
        _launch.run(script, num_workers=2, mtls_dir=tmp_path / "absent")
    assert not (tmp_path / "ran").exists()
    with pytest.raises(ValueError, match=r"either authenticates its workers"):
        _launch.run(script, num_workers=2, mtls_dir=made.directory, insecure_network=True)


def test_the_launcher_passes_the_credentials_to_every_worker(tmp_path, made):
    script = tmp_path / "show.py"
    script.write_text(
        "import os, sys\n"
        "rank = os.environ['SHARDFEED_RANK']\n"
        f"open({str(tmp_path)!r} + '/rank' + rank, 'w').write(os.environ['SHARDFEED_MTLS_DIR'])\n"
    )
    code = _launch.run(
        script, num_workers=2, mtls_dir=made.directory, timeout_s=60, isolate_network=False
    )
    assert code == 0
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == [made.directory] * 2


def test_shardfeed_credentials_command_makes_them_and_says_what_next(tmp_path, capsys):
    assert commands.main(["credentials", str(tmp_path / "c")]) == 0
    said = capsys.readouterr().out
    assert f"--mtls-dir {tmp_path / 'c'}" in said
    assert credentials.load_credentials(tmp_path / "c").directory == str(tmp_path / "c")
    assert commands.main(["credentials", str(tmp_path / "c")]) == 2
    assert "never overwrites one" in capsys.readouterr().err


def test_shardfeed_launch_refuses_a_host_without_the_credentials(tmp_path):
    script = tmp_path / "never.py"
    script.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "shardfeed._commands.cli", "launch", "-n", "2",
         "--mtls-dir", str(tmp_path / "absent"), str(script)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(
        "shardfeed launch: error: A multi-host job's credentials directory must hold"
    )


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        # A flipped byte in the certificate's body.
        (lambda d: _flip(d / "worker.pem", 200), "fails verification"),
        # Another job's key beside this job's certificate.
        ("other-key", "worker.pem and worker.key are not a PEM certificate and its key"),
        (lambda d: (d / "ca.pem").write_text("not a certificate\n"), "ca.pem is not a PEM CA"),
        # Another job's CA: this certificate is not its.
        ("other-ca", "a worker's certificate fails verification (CERTIFICATE_VERIFY_FAILED)"),
    ],
)
def test_an_edited_or_corrupt_file_is_refused_naming_it(made, tmp_path, edit, reason):
    copy = Path(shutil.copytree(made.directory, tmp_path / "copy"))  # modes kept
    if edit in ("other-key", "other-ca"):
        other = credentials.make_credentials(tmp_path / "other")
        name = "worker.key" if edit == "other-key" else "ca.pem"
        (copy / name).write_bytes((Path(other.directory) / name).read_bytes())
    else:
        edit(copy)
    with pytest.raises(ValueError) as caught:
        credentials.load_credentials(copy)
    assert str(caught.value).startswith(
        "A job's credentials directory must hold ca.pem, worker.pem and worker.key as "
        "`shardfeed credentials` wrote them: a CA, a certificate it signed and that "
        f"certificate's key. Received: SHARDFEED_MTLS_DIR={str(copy)!r} on host {HOST!r}: "
    ), caught.value
    assert reason in str(caught.value)
    assert str(caught.value).endswith(
        "Copy the job's directory again from where it was made (the same files on every host), "
        "or make new credentials for every host."
    )


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] = ord("A") if data[offset] != ord("A") else ord("B")
    path.write_bytes(bytes(data))
