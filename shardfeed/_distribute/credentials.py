"""A multi-host job's credentials: mutual TLS for the `jax.distributed` coordinator.

Owns the credentials directory (`make_credentials` writes it with `openssl`,
`load_credentials` checks it), the variables that carry it to the workers
(SHARDFEED_MTLS_DIR, SHARDFEED_INSECURE_NETWORK), and the rule each worker
applies (`network_security`, pure). Why one directory per job: a fresh CA
signs one worker certificate and its private key is deleted, so only hosts
holding that directory can join; the same command runs on every host when
the directory is on a shared file system or copied to each host.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import ssl
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from shardfeed._common import errors as _errors

MTLS_DIR_VARIABLE = "SHARDFEED_MTLS_DIR"
INSECURE_NETWORK_VARIABLE = "SHARDFEED_INSECURE_NETWORK"
CA_FILE = "ca.pem"
CERT_FILE = "worker.pem"
KEY_FILE = "worker.key"
# Every worker's certificate carries this URI SAN, and both ends require it of
# the peer: the coordinator is named by an IP address, which host name
# verification cannot match. The job's own CA is what authenticates.
PEER_URI_PREFIX = "spiffe://shardfeed/"
_PEER_URI = f"{PEER_URI_PREFIX}worker"
DEFAULT_VALID_DAYS = 30
_OPENSSL_TIMEOUT_S = 60

_MAKE_FIX = (
    "Make a job's credentials once with `shardfeed credentials DIR`, put DIR on every host "
    "(a shared file system, or copy it), and pass `--mtls-dir DIR` to `shardfeed launch` on "
    f"every host (srun, mpirun: export {MTLS_DIR_VARIABLE}=DIR)."
)


@dataclasses.dataclass(frozen=True)
class Credentials:
    """One job's mutual-TLS files, as `jax.distributed.initialize` takes them.

    Attributes:
        directory: The credentials directory.
        ca_file: The job's CA certificate (PEM): the only issuer a peer may have.
        cert_file: The workers' certificate (PEM), signed by that CA.
        key_file: Its private key (PEM), readable by its owner only.
    """

    directory: str
    ca_file: str
    cert_file: str
    key_file: str

    def jax_keywords(self) -> dict[str, object]:
        """The keyword arguments of `jax.distributed.initialize` (JAX >= 0.11.2)."""
        return {
            "mtls_cert_file": self.cert_file,
            "mtls_key_file": self.key_file,
            "mtls_ca_file": self.ca_file,
            "mtls_peer_uri_prefix": PEER_URI_PREFIX,
            "verify_secure_credentials": True,
        }


def _openssl(*args: str, cwd: str) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=_OPENSSL_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


def make_credentials(
    directory: str | os.PathLike[str], valid_days: int = DEFAULT_VALID_DAYS
) -> Credentials:
    """Writes a new job's credentials into `directory`, which must not exist yet.

    A fresh CA (EC P-256) signs one certificate for every worker; the CA's
    private key is deleted, so nobody can sign another. The directory is
    mode 0700, the key 0600.

    Args:
        directory: Where to write them (created; must not exist).
        valid_days: How long the certificates are valid.

    Returns:
        The `Credentials` written.

    Raises:
        FileExistsError: If `directory` exists (credentials are never overwritten).
        FileNotFoundError: If the `openssl` program is not installed.
        ValueError: If `valid_days` is not a positive integer.
    """
    _errors.require(
        _errors.is_integer(valid_days) and valid_days >= 1,
        "`valid_days` must be a positive number of days.",
        f"valid_days={valid_days!r}",
        f"Pass how long the job may run, e.g. {DEFAULT_VALID_DAYS}.",
    )
    target = Path(directory)
    if target.exists():
        raise FileExistsError(
            _errors.message(
                "`shardfeed credentials` writes a new directory and never overwrites one.",
                f"directory={str(target)!r} (exists)",
                "Name a directory that does not exist yet; every job gets its own.",
            )
        )
    if shutil.which("openssl") is None:
        raise FileNotFoundError(
            _errors.message(
                "Making credentials needs the `openssl` program.",
                f"openssl on PATH={os.environ.get('PATH', '')!r}: not found",
                "Install OpenSSL (e.g. `apt install openssl`), or make a CA, a certificate with "
                f"the URI SAN {_PEER_URI!r} and its key yourself, named {CA_FILE}, "
                f"{CERT_FILE}, {KEY_FILE}.",
            )
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed: a failure leaves no half-made directory.
    work = tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        days = str(valid_days)
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", CA_FILE, "-days", days,
            "-subj", f"/CN=shardfeed job CA {socket.gethostname()}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign",
            cwd=work,
        )  # fmt: skip
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", KEY_FILE, "-out", "worker.csr", "-subj", "/CN=shardfeed worker",
            cwd=work,
        )  # fmt: skip
        Path(work, "worker.ext").write_text(
            f"subjectAltName=URI:{_PEER_URI}\nextendedKeyUsage=serverAuth,clientAuth\n"
            "basicConstraints=critical,CA:FALSE\n"
        )
        _openssl(
            "x509", "-req", "-in", "worker.csr", "-CA", CA_FILE, "-CAkey", "ca.key",
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-out", CERT_FILE,
            "-days", days, "-extfile", "worker.ext",
            cwd=work,
        )  # fmt: skip
        for leftover in ("ca.key", "worker.csr", "worker.ext"):
            Path(work, leftover).unlink()
        for name in (CA_FILE, CERT_FILE, KEY_FILE):
            os.chmod(Path(work, name), 0o600)
        os.chmod(work, 0o700)
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return load_credentials(target)


def load_credentials(directory: str | os.PathLike[str]) -> Credentials:
    """Checks a credentials directory and returns its files (absolute paths).

    Raises:
        FileNotFoundError: If the directory or one of its files is missing,
            naming this host and the path.
        PermissionError: If the key is readable by others than its owner, or
            unreadable.
        ValueError: If a file is not what it should be (corrupt, edited, or a
            key that is not the certificate's).
    """
    host = socket.gethostname()
    base = Path(directory).absolute()
    files = {name: base / name for name in (CA_FILE, CERT_FILE, KEY_FILE)}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            _errors.message(
                "A multi-host job's credentials directory must hold "
                f"{CA_FILE}, {CERT_FILE} and {KEY_FILE} on every host.",
                f"{MTLS_DIR_VARIABLE}={str(base)!r} on host {host!r}, missing: "
                f"{', '.join(missing)}",
                _MAKE_FIX,
            )
        )
    key = files[KEY_FILE]
    if key.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(
            _errors.message(
                "The credentials' private key must be readable by its owner only: whoever "
                "reads it can join the job.",
                f"{key} on host {host!r} with mode {stat.filemode(key.stat().st_mode)}",
                f"Run `chmod 600 {key}` (and keep the directory 0700).",
            )
        )
    for path in files.values():
        if not os.access(path, os.R_OK):
            raise PermissionError(
                _errors.message(
                    "Every worker must read the job's credentials.",
                    f"{path} on host {host!r}: not readable by uid {os.getuid()}",
                    "Run the workers as the user who owns the credentials directory.",
                )
            )
    # A corrupt or edited file, or a key of another certificate, would reach JAX's
    # native code, which aborts the process with a gRPC log line: name it here, by
    # the handshake two workers will make (in memory, no socket).
    problem = _handshake_problem(files[CA_FILE], files[CERT_FILE], files[KEY_FILE])
    if problem is not None:
        raise ValueError(
            _errors.message(
                f"A job's credentials directory must hold {CA_FILE}, {CERT_FILE} and "
                f"{KEY_FILE} as `shardfeed credentials` wrote them: a CA, a certificate it "
                "signed and that certificate's key.",
                f"{MTLS_DIR_VARIABLE}={str(base)!r} on host {host!r}: {problem}",
                "Copy the job's directory again from where it was made (the same files on "
                "every host), or make new credentials for every host.",
            )
        )
    return Credentials(str(base), *(str(files[n]) for n in (CA_FILE, CERT_FILE, KEY_FILE)))


def _handshake_problem(ca_file: Path, cert_file: Path, key_file: Path) -> str | None:
    """Why two workers holding these files could not complete a mutual-TLS
    handshake (each side checks the other's chain against the CA), or None."""
    contexts = []
    for side in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(side)
        context.check_hostname = False  # the URI SAN stands in for the host name
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(ca_file)
        except ssl.SSLError as err:
            return f"{ca_file.name} is not a PEM CA certificate ({err.reason or err})"
        try:
            context.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as err:
            return (
                f"{cert_file.name} and {key_file.name} are not a PEM certificate and its key "
                f"({err.reason or err})"
            )
        contexts.append(context)
    pipes = [(ssl.MemoryBIO(), ssl.MemoryBIO()) for _ in contexts]
    server = contexts[0].wrap_bio(pipes[0][0], pipes[0][1], server_side=True)
    client = contexts[1].wrap_bio(pipes[1][0], pipes[1][1])
    done = [False, False]
    for _ in range(10):  # a TLS 1.3 handshake takes 2-3 round trips
        for index, end in enumerate((client, server)):
            if done[index]:
                continue
            try:
                end.do_handshake()
                done[index] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as err:
                return f"a worker's certificate fails verification ({err.reason or err})"
        # Carry each side's output to the other.
        pipes[0][0].write(pipes[1][1].read())
        pipes[1][0].write(pipes[0][1].read())
        if all(done):
            break
    try:  # the server verifies the client's certificate after its last flight
        server.read(1)
    except ssl.SSLWantReadError:
        pass
    except ssl.SSLError as err:
        return f"a worker's certificate fails verification ({err.reason or err})"
    return None if all(done) else "the handshake did not complete"


Security = Literal["loopback", "mtls", "insecure"]


def network_security(
    *,
    loopback: bool,
    credentials_given: bool,
    insecure_ok: bool,
    engine_has_mtls: bool,
    engine: str,
) -> Security:
    """What a `jax.distributed` job's coordinator uses (pure, so every rule is tested).

    "mtls" whenever credentials are given (a loopback job too); "loopback"
    for a job on 127.0.0.1 without them (it binds loopback only); for a
    multi-host job without them, "insecure" only where the user accepted it
    (SHARDFEED_INSECURE_NETWORK=1) or the engine has no mutual TLS.

    Raises:
        ValueError: For credentials the engine cannot use, or a multi-host job
            without credentials on an engine that has mutual TLS, each naming
            the fix.
    """
    if credentials_given:
        if not engine_has_mtls:
            raise ValueError(
                _errors.message(
                    "Mutual TLS for `jax.distributed` needs JAX >= 0.11.2.",
                    f"{MTLS_DIR_VARIABLE} set, {engine}",
                    'Install jax>=0.11.2 (`pip install -U "shardfeed[jax]"` on Python >= 3.12), '
                    f"or unset {MTLS_DIR_VARIABLE} and fence the job's ports "
                    "(docs/engines.md, Security).",
                )
            )
        return "mtls"
    if loopback:
        return "loopback"
    if insecure_ok or not engine_has_mtls:
        return "insecure"
    raise ValueError(
        _errors.message(
            "A multi-host `jax.distributed` job authenticates its workers with mutual TLS "
            "(JAX >= 0.11.2): without it, anyone who reaches the coordinator's port can join "
            "or stall the job.",
            f"{MTLS_DIR_VARIABLE} unset on host {socket.gethostname()!r}, {engine}",
            f"{_MAKE_FIX} On a network you trust, pass `--insecure-network` instead "
            f"({INSECURE_NETWORK_VARIABLE}=1).",
        )
    )


def credentials_from(environ: Mapping[str, str]) -> Credentials | None:
    """The credentials SHARDFEED_MTLS_DIR names (checked), or None when unset."""
    directory = environ.get(MTLS_DIR_VARIABLE, "").strip()
    return load_credentials(directory) if directory else None


def insecure_network_ok(environ: Mapping[str, str]) -> bool:
    """Whether SHARDFEED_INSECURE_NETWORK accepts an unauthenticated multi-host job.

    Raises:
        ValueError: For a value other than 0/1 (a typo must not open a job).
    """
    value = environ.get(INSECURE_NETWORK_VARIABLE, "").strip()
    _errors.require(
        value in ("", "0", "1"),
        f"{INSECURE_NETWORK_VARIABLE} must be 1 (accept an unauthenticated multi-host job) or 0.",
        f"{INSECURE_NETWORK_VARIABLE}={value!r}",
        f"Set {INSECURE_NETWORK_VARIABLE}=1 only on a network you trust, or unset it.",
    )
    return value == "1"


def refuse_credentials_without_mtls(environ: Mapping[str, str], runtime: str) -> None:
    """Refuses SHARDFEED_MTLS_DIR for a runtime that cannot authenticate (TensorFlow's
    gRPC servers, Horovod): a user who passed credentials expects them to be used.

    Raises:
        ValueError: If SHARDFEED_MTLS_DIR is set, naming the runtime and the fix.
    """
    directory = environ.get(MTLS_DIR_VARIABLE, "").strip()
    _errors.require(
        not directory,
        f"{runtime} has no authentication: the job's mutual-TLS credentials protect only a "
        "JAX job's `jax.distributed` coordinator.",
        f"{MTLS_DIR_VARIABLE}={directory!r} (`--mtls-dir`), {runtime}",
        "Drop `--mtls-dir` and fence the workers' ports to the job's hosts (docs/engines.md, "
        "Security), or run the job on the JAX backend (KERAS_BACKEND=jax, JAX >= 0.11.2).",
    )
