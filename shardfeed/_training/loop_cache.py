"""The loops of each model's current compile, kept across `fit`/`evaluate`/`predict` calls.

A loop's compiled calls hold their traces, so a second call compiles nothing;
a recompiled model (a new optimizer, loss or metrics) gets new loops, since its
old traces would run the replaced ones. Both backends' `loop_for` keep their
loops here (JAX: a dict of loops; TensorFlow, `_tf/compiled.py`: its traces
and its loops per dataset).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

E = TypeVar("E")


def compiled_parts(model: Any) -> tuple[Any, ...]:
    """What a recompile replaces (optimizer, loss, metrics), held weakly:
    traces of a replaced one must not serve a new one that got its `id`."""
    parts = (
        getattr(model, "optimizer", None),
        getattr(model, "_compile_loss", None),
        getattr(model, "_compile_metrics", None),
    )
    return tuple(None if p is None else weakref.ref(p) for p in parts)


class ModelCache(Generic[E]):
    """Per model, one entry (its loops, its traces) for its current compile,
    made by `new_entry()`.

    Weak keys: a dropped model frees its entry (a loop must hold its model
    weakly, or the model never drops).
    """

    def __init__(self, new_entry: Callable[[], E]) -> None:
        self._new_entry = new_entry
        self._by_model: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], E]]
        self._by_model = weakref.WeakKeyDictionary()

    def of(self, model: Any) -> E:
        """`model`'s entry, made anew when it was recompiled since."""
        compiled = compiled_parts(model)
        cached = self._by_model.get(model)
        if cached is None or cached[0] != compiled:
            cached = (compiled, self._new_entry())
            self._by_model[model] = cached
        return cached[1]
