"""The loops of each model's current compile, kept across `fit`/`evaluate`/`predict` calls.

A loop's compiled calls hold their traces, so a second call compiles nothing;
a recompiled model (a new optimizer, loss or metrics) gets new loops, since its
old traces would run the replaced ones. JAX's `loop_for` keeps its loops here;
TensorFlow's (`_tf/compiled.py`) keeps its own by dataset and shares traces by
model on the same rule.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


def compiled_parts(model: Any) -> tuple[Any, ...]:
    """What a recompile replaces (optimizer, loss, metrics), held weakly:
    traces of a replaced one must not serve a new one that got its `id`."""
    parts = (
        getattr(model, "optimizer", None),
        getattr(model, "_compile_loss", None),
        getattr(model, "_compile_metrics", None),
    )
    return tuple(None if p is None else weakref.ref(p) for p in parts)


class ModelCache(Generic[V]):
    """Per model, a dict of values (loops, traces) for its current compile.

    Weak keys: a dropped model frees its entries (a loop must hold its model
    weakly, or the model never drops).
    """

    def __init__(self) -> None:
        self._by_model: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], dict[Hashable, V]]]
        self._by_model = weakref.WeakKeyDictionary()

    def of(self, model: Any) -> dict[Hashable, V]:
        """`model`'s entries, emptied first when it was recompiled since."""
        compiled = compiled_parts(model)
        cached = self._by_model.get(model)
        if cached is None or cached[0] != compiled:
            cached = (compiled, {})
            self._by_model[model] = cached
        return cached[1]
