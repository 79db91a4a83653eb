"""The worker process of a bench variant on another Keras backend (`jax`, `jax-tuned`,
`shardfeed-jax`, `floor-jax`).

Separation of concerns: this module owns the worker side of
`variants._OtherBackend` -- checking that the backend imports, rebuilding the
workload's data and the reference weights it is sent, then running the
variant's `setup()` and one `epoch(e)` per request. What the variant does is
`variants`' (the same `_KerasFit` and `_Tuned` classes as on TensorFlow) and
`jax_variants`' (`shardfeed.fit` and the floor on JAX); this module only
carries it across the process boundary.

Protocol, one JSON object per line. In, on stdin: the set-up (`variant`,
`workload`, `rows`, `seed`, `probe_budget_s`, `weights_path`), then
`{"epoch": e}` per epoch; end of input ends the process. Out, on the original
stdout: `{"settings", "extra"}` or `{"skipped": why}`, then `{"seconds",
"loss", "settings"}` per epoch. Everything else the process prints (the probe's lines,
Keras, the backend) goes to stderr, which the bench shares.

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
INSTALL_HINTS = {"jax": 'pip install "shardfeed[jax]" (CPU JAX)'}


def _send(out: TextIO, reply: dict[str, Any]) -> None:
    out.write(json.dumps(reply) + "\n")
    out.flush()


def _backend_version(backend: str) -> str | None:
    """Imports the backend's module and returns its version; raises ImportError
    when it is not installed here (or fails to load)."""
    module = importlib.import_module(BACKEND_MODULES[backend])
    version: str | None = getattr(module, "__version__", None)
    return version


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
            f"{error}); install it: {INSTALL_HINTS[backend]}"
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
    }
    _send(replies, {"settings": variant.settings, "extra": extra})
    for line in sys.stdin:
        seconds, loss = variant.epoch(json.loads(line)["epoch"])
        # The settings again: `shardfeed.fit`'s are known after its first epoch.
        _send(replies, {"seconds": seconds, "loss": loss, "settings": variant.settings})
    return 0


if __name__ == "__main__":
    sys.exit(main())
