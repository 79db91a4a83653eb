"""The carried wheels of `.ci/gpu-check.sh`: which to fetch, which to install, and where.

Standard library only: it runs under the lent machine's Python (a venv with JAX,
NumPy and pip, no Keras, no network) and under .ci/setup's Python for the
download. Subcommands:

    missing DIR SPEC...       print the NAME==VERSION specs with no wheel in DIR
    pick DIR DEST SPEC...     make DEST hold exactly the wheels of SPECs from DIR
    install WHEELS SITE NIGHTLY   pip-install WHEELS/*.whl offline: keras-nightly into
                              NIGHTLY, the rest into SITE, each only where this Python
                              lacks it (keras: unless it has that exact version);
                              never jax, jaxlib, numpy or a JAX plugin
    check DIR...              fail if this Python (with PYTHONPATH) imports jax, jaxlib
                              or numpy from one of DIRs, i.e. a carried copy shadows
                              the machine's

Why `--target` and PYTHONPATH, not a venv: on the lent machine `python3` is
itself a venv, and a venv made from it with `--system-site-packages` sees the
base interpreter's packages, not that venv's, so it has no JAX or NumPy
(shared/notes.md, 2026-12-02).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The machine's own: a carried copy on PYTHONPATH would shadow the CUDA build.
NEVER_INSTALLED = ("jax", "jaxlib", "numpy")
NEVER_PREFIXES = ("jax-cuda", "jax-rocm")
NIGHTLY = "keras-nightly"
# Installed even when this Python has another version of it: the Keras under test.
EXACT = ("keras",)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(wheel: Path) -> tuple[str, str]:
    """A wheel's distribution name (normalized) and version, from its file name."""
    name, version = wheel.name.split("-")[:2]
    return _normalize(name), version


def _spec(text: str) -> tuple[str, str]:
    name, version = text.split("==")
    return _normalize(name), version


def _wheels(folder: Path) -> dict[tuple[str, str], Path]:
    return {wheel_name_version(w): w for w in sorted(folder.glob("*.whl"))}


def missing(folder: Path, specs: list[str]) -> list[str]:
    """The specs with no wheel of that name and version in `folder`."""
    have = _wheels(folder) if folder.is_dir() else {}
    return [s for s in specs if _spec(s) not in have]


def pick(folder: Path, dest: Path, specs: list[str]) -> list[Path]:
    """Empties `dest` of wheels, then copies in the wheels of `specs` from `folder`."""
    have = _wheels(folder)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    return [Path(shutil.copy2(have[_spec(s)], dest)) for s in specs]


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan(wheels: list[Path]) -> tuple[list[Path], list[Path], list[str]]:
    """(wheels for SITE, wheels for NIGHTLY, one log line per wheel).

    Raises:
        SystemExit: Two wheels of one distribution (which one is meant?).
    """
    site, nightly, lines = [], [], []
    seen: dict[str, Path] = {}
    for wheel in wheels:
        name, version = wheel_name_version(wheel)
        if name in seen:
            raise SystemExit(
                f"gpu_wheels: one wheel per distribution. Received: {seen[name].name} and "
                f"{wheel.name}. Remove one, or run `bash .ci/gpu-check.sh download` again."
            )
        seen[name] = wheel
        have = _installed(name)
        if name in NEVER_INSTALLED or name.startswith(NEVER_PREFIXES):
            lines.append(f"not installed: {wheel.name} ({name} is the machine's: {have})")
        elif name == NIGHTLY:
            nightly.append(wheel)
            lines.append(f"install {wheel.name} (its own folder)")
        elif have is not None and (name not in EXACT or have == version):
            lines.append(f"kept the machine's {name} {have} (carried: {version})")
        else:
            site.append(wheel)
            lines.append(f"install {wheel.name}" + (f" (the machine has {have})" if have else ""))
    return site, nightly, lines


def _pip_target(wheels: list[Path], target: Path) -> None:
    if not wheels:
        return
    command = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    command += ["--no-index", "--no-deps", "--target", str(target), *map(str, wheels)]
    subprocess.run(command, check=True)


def install(folder: Path, site_dir: Path, nightly_dir: Path) -> None:
    site, nightly, lines = plan(sorted(folder.glob("*.whl")))
    for line in lines:
        print(f"gpu_wheels: {line}", flush=True)
    _pip_target(site, site_dir)
    _pip_target(nightly, nightly_dir)


def check(folders: list[Path]) -> None:
    """Exits non-zero when jax, jaxlib or numpy would be imported from `folders`."""
    inside = [f.resolve() for f in folders]
    for name in NEVER_INSTALLED:
        module = importlib.import_module(name)
        where = Path(module.__file__ or "").resolve()
        if any(where.is_relative_to(f) for f in inside):
            raise SystemExit(
                f"gpu_wheels: {name} must be the machine's own. Received: {name} from {where}. "
                "Remove its wheel from the carried folder."
            )


def main(argv: list[str]) -> None:
    command, *rest = argv
    if command == "missing":
        print("\n".join(missing(Path(rest[0]), rest[1:])))
    elif command == "pick":
        pick(Path(rest[0]), Path(rest[1]), rest[2:])
    elif command == "install":
        install(Path(rest[0]), Path(rest[1]), Path(rest[2]))
    elif command == "check":
        check([Path(r) for r in rest])
    else:
        raise SystemExit(f"gpu_wheels: unknown command. Received: {command!r}. See the docstring.")


if __name__ == "__main__":
    main(sys.argv[1:])
