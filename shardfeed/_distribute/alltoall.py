"""All-to-all of rows between replicas: how the engines move a round of an exchange.

Separation of concerns: the dataset decides which rows go where
(`_data/exchange.py`); this module only moves tensors. Every function takes,
per local replica, the rows it sends grouped by destination replica, and
the `[R, R]` matrix of counts (known to every rank, so nothing is
negotiated), and returns, per local replica, the rows it receives grouped by
source replica.

- One process holds every replica (the default strategy, MirroredStrategy):
  device-to-device copies of each slice (`local_all_to_all`).
- Several workers under a `tf.distribute` strategy: TensorFlow offers no
  all-to-all through a strategy's collectives, so one bounded all-gather per
  round (`gathered_all_to_all`): each replica contributes its send buffer,
  padded to the round's largest, and keeps the slices meant for it.
- Horovod: `hvd.alltoall` with splits (in `horovod.py`).
Collective paths carry rows as int32 words (`to_words`, `array_to_words`):
TensorFlow's collective gather takes only 32/64-bit and float types, rows
may be uint8 or bool. They gather through `gather_words`, one compiled
function per strategy.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

_GATHERS: weakref.WeakKeyDictionary[tf.distribute.Strategy, Any] = weakref.WeakKeyDictionary()


def gather_words(strategy: tf.distribute.Strategy, words: Any) -> tf.Tensor:
    """`strategy.gather(words, axis=0)` of per-replica int32 `[n, w]` words,
    inside one compiled function per strategy.

    Called eagerly under MultiWorkerMirroredStrategy, `strategy.gather` wraps
    its collective in a new `tf.function` on every call
    (`CollectiveAllReduce._batch_all_gather`), tracing each time, and
    TensorFlow warns about the retracing from the fifth call on. Inside this
    function that wrapping happens only while it traces: once, and once more
    when the shapes first change (`reduce_retracing` then leaves `n` and `w`
    open), so one dtype (words) serves every caller.
    """
    gather = _GATHERS.get(strategy)
    if gather is None:
        owner = weakref.ref(strategy)  # the cache must not keep the strategy alive

        def gather_fn(value: Any) -> tf.Tensor:
            live = owner()
            assert live is not None  # the cache entry dies with its strategy
            return live.gather(value, axis=0)

        gather = tf.function(gather_fn, reduce_retracing=True)
        _GATHERS[strategy] = gather
    return gather(words)


def array_to_words(array: np.ndarray) -> np.ndarray:
    """`[n, ...]` rows of any dtype as `[n, words]` int32 (bytes padded to a
    word), on the host: `to_words` for NumPy arrays."""
    rows = np.ascontiguousarray(array)
    n = rows.shape[0]
    as_bytes = rows.reshape(n, math.prod(rows.shape[1:])).view(np.uint8)
    pad = -as_bytes.shape[1] % 4
    return np.ascontiguousarray(np.pad(as_bytes, ((0, 0), (0, pad)))).view(np.int32)


def array_from_words(words: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Inverse of `array_to_words`: rows shaped and typed like `like`'s rows."""
    row_shape = like.shape[1:]
    row_bytes = math.prod(row_shape) * like.dtype.itemsize
    as_bytes = np.ascontiguousarray(words.view(np.uint8)[:, :row_bytes])
    return as_bytes.view(like.dtype).reshape(words.shape[0], *row_shape)


def local_all_to_all(
    send: Sequence[tf.Tensor], counts: np.ndarray, devices: Sequence[str]
) -> list[tf.Tensor]:
    """Every replica in this process: copies each slice to its destination's device."""
    offsets = np.cumsum(counts, axis=1) - counts
    out = []
    for d, device in enumerate(devices):
        with tf.device(device):
            parts = [
                tf.identity(send[s][offsets[s, d] : offsets[s, d] + counts[s, d]])
                for s in range(len(send))
                if counts[s, d]
            ]
            out.append(tf.concat(parts, axis=0) if parts else tf.identity(send[d][:0]))
    return out


def gathered_all_to_all(
    strategy: tf.distribute.Strategy,
    distribute,
    send: Sequence[tf.Tensor],
    counts: np.ndarray,
    local_ids: Sequence[int],
    devices: Sequence[str],
) -> list[tf.Tensor]:
    """Several workers under a strategy: one all-gather of padded send buffers.

    Args:
        strategy: The strategy whose collectives gather.
        distribute: Places one value per local replica (`Engine.distribute`).
        send: Per local replica, its rows grouped by destination.
        counts: `[R, R]` rows from each replica to each.
        local_ids: Global ids of the local replicas.
        devices: Their devices.

    Returns:
        Per local replica, the rows it receives, grouped by source.
    """
    width = max(1, int(counts.sum(axis=1).max()))
    template = send[0]
    padded = []
    for t, device in zip(send, devices, strict=True):
        with tf.device(device):
            words = to_words(t)
            fill = tf.zeros([width - int(words.shape[0]), int(words.shape[1])], words.dtype)
            padded.append(tf.concat([words, fill], axis=0))
    everything = gather_words(strategy, distribute(padded))
    offsets = np.cumsum(counts, axis=1) - counts
    out = []
    for d, device in zip(local_ids, devices, strict=True):
        rows = np.concatenate(
            [np.arange(s * width + offsets[s, d], s * width + offsets[s, d] + counts[s, d])
             for s in range(len(counts))]
        ).astype(np.int64)
        with tf.device(device):
            out.append(from_words(tf.gather(everything, rows), template))
    return out


def to_words(rows: tf.Tensor) -> tf.Tensor:
    """`[n, ...]` rows of any dtype as `[n, words]` int32 (bytes padded to a word)."""
    if rows.dtype == tf.bool:
        rows = tf.cast(rows, tf.uint8)
    n = int(rows.shape[0])
    as_bytes = tf.reshape(tf.bitcast(rows, tf.uint8) if rows.dtype != tf.uint8 else rows, [n, -1])
    row_bytes = int(as_bytes.shape[1])
    pad = -row_bytes % 4
    as_bytes = tf.concat([as_bytes, tf.zeros([n, pad], tf.uint8)], axis=1)
    return tf.bitcast(tf.reshape(as_bytes, [n, -1, 4]), tf.int32)


def from_words(words: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Inverse of `to_words`: rows shaped and typed like `like`'s rows."""
    n = int(words.shape[0])
    dtype = like.dtype
    stored = tf.uint8 if dtype == tf.bool else dtype
    row_shape = list(like.shape[1:])
    row_bytes = math.prod(row_shape) * stored.size
    as_bytes = tf.reshape(tf.bitcast(words, tf.uint8), [n, -1])[:, :row_bytes]
    if stored.size == 1:
        rows = tf.reshape(as_bytes, [n, *row_shape])
        rows = rows if stored == tf.uint8 else tf.bitcast(rows, stored)
    else:
        rows = tf.bitcast(tf.reshape(as_bytes, [n, *row_shape, stored.size]), stored)
    return tf.cast(rows, tf.bool) if dtype == tf.bool else rows
