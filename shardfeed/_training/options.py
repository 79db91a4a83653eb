"""`FitOptions`: how the compiled training loop runs, frozen and validated when built."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from shardfeed._common import errors as _errors
from shardfeed._data.options import _as_int


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """How the compiled training loop runs.

    Attributes:
        steps_per_execution: Steps per compiled call, or "auto": the model's
            `compile(steps_per_execution=k)` when `k > 1`, else about 10
            calls per epoch, at most 512 steps each (on JAX, a model with a
            convolution on CPU devices runs its steps unrolled, at most 8 per
            call: shardfeed/_commands/bench/NOTES.md; an integer that differs
            from such a `k` is refused: see `with_model_steps`). Only each
            call's logs come back to Python, so callbacks' `on_*_batch_end`
            hooks and the progress bar see one update per call.
        jit_compile: XLA for the step: True, False, or "auto" (on for GPUs;
            on CPUs only for models without convolutions, which XLA's CPU
            backend runs far slower inside loops). On TensorFlow the epoch's
            partial last step, one step, runs without XLA: compiling it cost
            more than XLA saved it.
        sync_check: With more than one replica, check that every replica
            holds the same trainable weights (integer checksums gathered from
            all replicas; a clear error names the first diverged variable):
            True (default) at the end of each epoch, an integer k also after
            every k-th compiled call, or False (never).
        sparse_as_dense: Densify sparse gradients (`tf.IndexedSlices`, e.g.
            an `Embedding`'s) before they cross replicas and reach the
            optimizer, which all-reduces whole tables, as Horovod's
            `DistributedOptimizer(sparse_as_dense=True)`. False (default):
            each step all-gathers only the rows touched, all sparse gradients
            in one exchange. Not only speed: Keras' Adam squares an
            `IndexedSlices`' values before summing rows a batch repeats, so
            results differ from the sparse path when ids repeat in a step.

    Example:
        >>> FitOptions(steps_per_execution=64, jit_compile=False)
    """

    steps_per_execution: int | Literal["auto"] = "auto"
    jit_compile: bool | Literal["auto"] = "auto"
    sync_check: bool | int = True
    sparse_as_dense: bool = False

    def __post_init__(self) -> None:
        spe = self.steps_per_execution
        _errors.require(
            (isinstance(spe, str) and spe == "auto") or (_errors.is_integer(spe) and spe >= 1),
            '`steps_per_execution` must be "auto" or an integer >= 1.',
            f"steps_per_execution={spe!r}",
            'Use "auto" or e.g. 64.',
        )
        _errors.require(
            _errors.is_switch(self.jit_compile),
            '`jit_compile` must be True, False or "auto".',
            f"jit_compile={self.jit_compile!r}",
            'Use "auto" unless you measured otherwise.',
        )
        _errors.require(
            isinstance(self.sync_check, bool)
            or (_errors.is_integer(self.sync_check) and self.sync_check >= 1),
            "`sync_check` must be True, False or an integer >= 1 (every k calls).",
            f"sync_check={self.sync_check!r}",
            "Use True (each epoch), False (off) or e.g. 10.",
        )
        _errors.require(
            isinstance(self.sparse_as_dense, bool),
            "`sparse_as_dense` must be True or False.",
            f"sparse_as_dense={self.sparse_as_dense!r}",
            "Use False (sparse gradients stay sparse) or True (densified, as Horovod's option).",
        )
        _as_int(self, "steps_per_execution")
        if not isinstance(self.sync_check, bool):
            _as_int(self, "sync_check")

    @property
    def sync_check_every_calls(self) -> int | None:
        """`sync_check`'s k: the replicas are also compared after every k-th
        compiled call (None: only at the end of each epoch, or never)."""
        return None if isinstance(self.sync_check, bool) else self.sync_check

    @property
    def sync_check_each_epoch(self) -> bool:
        """Whether the replicas are compared at the end of each epoch
        (`sync_check` True or an integer)."""
        return self.sync_check is not False


def with_model_steps(options: FitOptions, model: Any) -> FitOptions:
    """`options` with the model's `compile(steps_per_execution=k)` applied.

    Precedence: `FitOptions(steps_per_execution="auto")` (the default) takes
    the model's `k` when it is above 1 (Keras' default of 1 cannot be told
    from an explicit 1, so it leaves "auto": pass `FitOptions(steps_per_execution=1)`
    for one step per call); an explicit `FitOptions` value equal to `k`, or
    with a model compiled with 1, is used as it is; a different one is refused.

    Raises:
        ValueError: When `FitOptions.steps_per_execution` and the model's
            compiled `steps_per_execution` (above 1) disagree.
    """
    compiled = getattr(model, "steps_per_execution", 1)
    if not (_errors.is_integer(compiled) and compiled > 1):
        return options
    spe = options.steps_per_execution
    if isinstance(spe, str):
        return dataclasses.replace(options, steps_per_execution=int(compiled))
    if spe != compiled:
        raise ValueError(
            _errors.message(
                "`FitOptions.steps_per_execution` and the model's compiled "
                "`steps_per_execution` must agree (both set the steps per compiled call).",
                f"FitOptions.steps_per_execution={spe}, "
                f"model.compile(steps_per_execution={compiled})",
                "Set one of them: leave `FitOptions.steps_per_execution` as \"auto\" to use "
                "the model's, or compile the model with `steps_per_execution=1`.",
            )
        )
    return options


def auto_steps_per_execution(steps: int) -> int:
    """About ten calls per epoch, between 1 and 512 steps per call."""
    return max(1, min(512, math.ceil(steps / 10)))


def has_convolution(model: Any) -> bool:
    """Whether the model has one of Keras' convolution layers: XLA:CPU ran
    them slower inside a compiled step loop (TensorFlow's "auto" `jit_compile`,
    JAX's unrolled steps; shardfeed/_commands/bench/NOTES.md). A layer calling
    `keras.ops.conv` itself is not seen."""
    import keras  # here: `FitOptions` is imported before any Keras backend is chosen

    layers = keras.layers
    convolutions = (
        layers.Conv1D, layers.Conv2D, layers.Conv3D,
        layers.Conv1DTranspose, layers.Conv2DTranspose, layers.Conv3DTranspose,
        layers.DepthwiseConv1D, layers.DepthwiseConv2D,
        layers.SeparableConv1D, layers.SeparableConv2D,
    )  # fmt: skip
    return any(isinstance(layer, convolutions) for layer in model._flatten_layers())
