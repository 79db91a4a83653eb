"""How shardfeed makes a TensorFlow function (`compiled`: no AutoGraph, as
Keras compiles its steps) and its step loops (`steps_from`: a `tf.while_loop`
from a tensor first step)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf


def compiled(fn: Callable[..., Any], jit_compile: bool | None = None) -> Any:
    """`tf.function(fn)` without AutoGraph, as Keras compiles its steps
    (`do_not_convert`): a model's own `train_step` runs as Keras runs it, and
    no trace pays for converting our code (1.9 s per process, once, for the
    loop's 31 functions). The step loops are `tf.while_loop`s (`steps_from`)."""
    return tf.function(fn, jit_compile=jit_compile, autograph=False)


def steps_from(first: Any, steps: int, step: Callable[[Any], Any], *state: Any) -> Any:
    """Runs `state = step(i, *state)` for `i` in `[first, steps)` in a
    compiled call; returns the last state (None without one).

    A `while` from a tensor `first`, not a `tf.range`: XLA takes a range's
    bounds as compile-time constants, and compiled the loop again for each
    `first` (an epoch's shorter call starts inside its window)."""

    def body(i: Any, *state: Any) -> Any:
        after = step(i, *state)
        return (i + 1, *(after if state else ()))

    out = tf.while_loop(lambda i, *_: i < steps, body, (first, *state))
    return tuple(out[1:]) if state else None
