"""How shardfeed makes a TensorFlow function (`compiled`: no AutoGraph, as
Keras compiles its steps) and its step loops (`steps_from`: a `tf.while_loop`
from a tensor first step), and the names of the loop's compiled calls (`Mode`,
`Piece`: here, below `loop`, `calls` and `traces`, which all use them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import tensorflow as tf

Mode = Literal["train", "test", "predict"]


# A compiled call's kind: `steps` runs a `[k, batch]` slice of the epoch's steps,
# `partial` the partial last step alone (row counts per replica); one replica
# under XLA trains `gathered` (a call's rows gathered with TensorFlow's kernel,
# then XLA's step loop over them, `rows`).
Piece = Literal["steps", "partial", "gathered", "rows"]


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
