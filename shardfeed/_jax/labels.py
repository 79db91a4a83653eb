"""A label column's `(min, max, fractional)` per replica on JAX, reduced on each device
(padding excluded; three scalars come back): the sparse-label check's input."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shardfeed._data.plan import ShardPlan


@functools.partial(jax.jit, static_argnums=(1, 2))
def _stats(values: jax.Array, rows: int, ignore: int | None) -> jax.Array:
    values = values[:rows]
    if values.dtype == jnp.bool_:
        values = values.astype(jnp.int8)
    info = jnp.finfo(values.dtype) if jnp.issubdtype(values.dtype, jnp.floating) else None
    if ignore is not None and (info is not None or jnp.iinfo(values.dtype).min <= ignore
                               <= jnp.iinfo(values.dtype).max):
        values = jnp.where(values == ignore, jnp.zeros_like(values), values)
    fractional = jnp.any(values != jnp.floor(values)) if info is not None else jnp.array(False)
    return jnp.stack([jnp.min(values).astype(jnp.float32), jnp.max(values).astype(jnp.float32),
                      fractional.astype(jnp.float32)])


def label_stats(table: Any, plan: ShardPlan, replica_ids: tuple[int, ...],
                devices: tuple[Any, ...], ignore: int | None) -> list[np.ndarray]:
    """Per local replica, float64 `[min, max, fractional]` of its rows of one
    column (`table`, the column's global array); `[inf, -inf, 0]` without rows.
    `fractional` is 1.0 if some value is not a whole number or NaN.

    Example:
        >>> label_stats(ds.tables[1], ds.eval_plan, (0,), (jax.devices()[0],), None)
        [array([0., 9., 0.])]
    """
    shards = {s.device: s.data for s in table.addressable_shards}
    out = []
    for replica, device in zip(replica_ids, devices, strict=True):
        start, stop = plan.shards[replica]
        if stop == start:
            out.append(np.array([np.inf, -np.inf, 0.0]))
            continue
        out.append(np.asarray(_stats(shards[device], stop - start, ignore), dtype=np.float64))
    return out
