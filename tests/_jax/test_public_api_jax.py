"""The public API on the JAX backend: the same names, resolved to `shardfeed._jax`
or to the backend-neutral modules; a name with no JAX implementation raises,
naming the backend and the fix (tests/test_public_api.py pins the table)."""

from __future__ import annotations

import importlib.util
import re

import pytest

import shardfeed


def test_every_public_name_resolves_on_jax_or_says_why():
    for name in shardfeed.__all__:
        module = shardfeed._JAX_EXPORTS[name]
        if module is not None and importlib.util.find_spec(module) is not None:
            value = getattr(shardfeed, name)
            assert value.__module__ == module, name
        else:
            with pytest.raises(NotImplementedError, match=re.escape(
                f"`shardfeed.{name}` has no implementation on the JAX backend yet"
            )):
                getattr(shardfeed, name)


def test_a_name_missing_on_jax_names_the_backend_and_the_fix(monkeypatch):
    # Every name has a JAX implementation today: a missing one is made here.
    monkeypatch.setitem(shardfeed._JAX_EXPORTS, "ResidentIterator", None)
    with pytest.raises(NotImplementedError) as info:
        shardfeed.__getattr__("ResidentIterator")
    assert str(info.value) == (
        "`shardfeed.ResidentIterator` has no implementation on the JAX backend yet "
        "(docs/engines.md lists what each backend supports). Received: "
        "name='ResidentIterator', keras.backend.backend()='jax'. Use the TensorFlow backend "
        "(`KERAS_BACKEND=tensorflow`)."
    )


def test_resident_iterator_is_the_jax_one():
    from shardfeed._jax import iterator

    assert shardfeed.ResidentIterator is iterator.ResidentIterator


def test_world_is_the_jax_one():
    from shardfeed._jax import world

    assert shardfeed.World is world.World
