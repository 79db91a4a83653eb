"""The worker process of a bench variant on another Keras backend (`jax`, `jax-tuned`,
`shardfeed-jax`, `floor-jax`, `jax-nightly-tuned`): carries `variants._OtherBackend` across
the process boundary.

Protocol, one JSON object per line. In, on stdin: the set-up (`variant`,
`workload`, `rows`, `seed`, `probe_budget_s`, `weights_path`, `keras_nightly`),
then `{"epoch": e}` per epoch; end of input ends the process. Out, on the
original stdout: `{"settings", "extra"}` or `{"skipped": why}`, then
`{"seconds", "loss", "settings"}` per epoch; everything else goes to stderr.

Run as `KERAS_BACKEND=jax python -m shardfeed._commands.bench.backend_worker`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, TextIO

from shardfeed._common.errors import message

# What a variant's backend needs, per `KERAS_BACKEND`: the module to import
# and how to install it.
BACKEND_MODULES = {"jax": "jax"}
# Not into this environment: TensorFlow imports JAX whenever it is installed beside
# it (slower imports, other memory; requirements-jax.txt says more).
INSTALL_HINTS = {
    "jax": 'make a venv of its own for Keras on JAX, without TensorFlow (`python -m venv '
    '.venv-jax && .venv-jax/bin/pip install "shardfeed[jax]"`), and pass `--jax-python '
    '.venv-jax/bin/python` (or set SHARDFEED_JAX_PYTHON)'
}


def _send(out: TextIO, reply: dict[str, Any]) -> None:
    out.write(json.dumps(reply) + "\n")
    out.flush()


def _backend_version(backend: str) -> str | None:
    """Imports the backend's module and returns its version; raises ImportError
    when it is not installed here (or fails to load)."""
    module = importlib.import_module(BACKEND_MODULES[backend])
    version: str | None = getattr(module, "__version__", None)
    return version


def worker_versions(backend: str) -> dict[str, Any]:
    """The worker's Python, Keras and (on JAX) JAX, jaxlib, NumPy and devices,
    each library with the file it was imported from."""
    import keras
    import numpy as np

    found: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "keras": keras.__version__,
        "keras_file": keras.__file__,
        "numpy": np.__version__,
        "numpy_file": np.__file__,
    }
    if backend == "jax":
        import jax
        import jaxlib

        found.update(
            jax=jax.__version__,
            jax_file=jax.__file__,
            jaxlib=jaxlib.__version__,
            devices=[f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()],
        )
    return found


def versions_text(found: dict[str, Any]) -> str:
    """`worker_versions` in one line, for the log."""
    text = f"Python {found['python']} ({found['executable']}), Keras {found['keras']} "
    text += f"({found['keras_file']}), NumPy {found['numpy']} ({found['numpy_file']})"
    if "jax" in found:
        text += f", JAX {found['jax']} ({found['jax_file']}), jaxlib {found['jaxlib']}, "
        text += f"devices {', '.join(found['devices'])}"
    return text


def main() -> int:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # prints from Keras, the backend or the probe go to stderr, not the replies
    sys.stdout = sys.stderr
    setup = json.loads(sys.stdin.readline())
    backend = os.environ.get("KERAS_BACKEND", "")
    try:
        version = _backend_version(backend)
    except ImportError as error:
        reason = (
            f"{backend} is not importable in the worker process ({type(error).__name__}: "
            f"{error}); {INSTALL_HINTS[backend]}"
        )
        _send(replies, {"skipped": reason})
        return 0

    import keras
    import numpy as np

    from shardfeed._commands.bench.variants import IN_WORKER_TYPES
    from shardfeed._commands.bench.workloads import WORKLOADS, build_model, make_data

    if keras.backend.backend() != backend:
        raise RuntimeError(
            message(
                f"The worker process must run Keras on {backend!r}; it runs on "
                f"{keras.backend.backend()!r}.",
                f"KERAS_BACKEND={backend!r}",
                "Set KERAS_BACKEND in the worker's environment (variants._OtherBackend does).",
            )
        )
    versions = worker_versions(backend)
    print(f"backend_worker {setup['variant']}: {versions_text(versions)}", flush=True)
    if setup.get("keras_nightly") and ".dev" not in keras.__version__:
        reason = (
            f"the worker imported Keras {keras.__version__} from {keras.__file__}, not a "
            "keras-nightly (3.16.0.dev) build; put the folder keras-nightly was installed into "
            "first on the worker's path (SHARDFEED_KERAS_NIGHTLY_PATH)"
        )
        _send(replies, {"skipped": reason})
        return 0
    workload = WORKLOADS[setup["workload"]]
    data = make_data(workload, setup["rows"], setup["seed"])
    reference = build_model(workload, False, setup["seed"])
    with np.load(setup["weights_path"]) as weights:
        reference.set_weights([weights[f"arr_{i}"] for i in range(len(weights.files))])
    args = argparse.Namespace(seed=setup["seed"], probe_budget_s=setup["probe_budget_s"])
    types = dict(IN_WORKER_TYPES)
    if backend == "jax":
        from shardfeed._commands.bench.jax_variants import IN_WORKER_TYPES_JAX

        types.update(IN_WORKER_TYPES_JAX)
    variant = types[setup["variant"]](workload, data, reference, args)
    variant.setup()
    extra = {
        **variant.extra,
        "backend": backend,
        "backend_version": version,
        "tensorflow_imported": "tensorflow" in sys.modules,  # Keras on JAX alone: False
        "worker": versions,
    }
    _send(replies, {"settings": variant.settings, "extra": extra})
    for line in sys.stdin:
        seconds, loss = variant.epoch(json.loads(line)["epoch"])
        # The settings again: `shardfeed.fit`'s are known after its first epoch.
        _send(replies, {"seconds": seconds, "loss": loss, "settings": variant.settings})
    return 0


if __name__ == "__main__":
    sys.exit(main())
