"""All-to-all of rows between replicas: how the engines move a round of the exchange.

Rows travel as int32 words (`to_words`; collectives take no uint8 or bool):
device copies within one process (`local_all_to_all`), one all-gather per round
across `tf.distribute` workers, which offer no all-to-all (`GatheredAllToAll`,
traced once per row width), `hvd.alltoall` under Horovod (`horovod.py`).
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

        gather = tf.function(gather_fn, reduce_retracing=True, autograph=False)
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


def words_per_row(row_shape: Sequence[int], dtype: tf.DType) -> int:
    """Int32 words `to_words` makes of one row of `row_shape` and `dtype`."""
    stored = tf.uint8 if dtype == tf.bool else dtype
    return -(-math.prod(row_shape) * stored.size // 4)


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


class GatheredAllToAll:
    """Several workers under a strategy: one all-gather of every replica's send words.

    Each call is one compiled function whose rows dimension is symbolic
    (`input_signature`), so every round of every epoch reuses the first
    trace (an eager `strategy.gather` under MultiWorkerMirroredStrategy wraps
    a new `tf.function` per call; per-round shapes retrace a compiled one).
    `strategy.gather` all-gathers the first dimensions itself, so replicas
    send unequal row counts unpadded.

    Args:
        strategy: The strategy whose collectives gather.
        local_ids: Global ids of the local replicas.
        devices: Their devices.
    """

    def __init__(
        self, strategy: tf.distribute.Strategy, local_ids: Sequence[int], devices: Sequence[str]
    ) -> None:
        self._strategy = strategy
        self._local_ids, self._devices = tuple(local_ids), tuple(devices)
        self._functions: dict[int, Any] = {}

    @property
    def tracing_count(self) -> int:
        """Traces of this exchange's compiled functions so far (one per row width)."""
        return sum(f.experimental_get_tracing_count() for f in self._functions.values())

    def __call__(self, send: Sequence[tf.Tensor], counts: np.ndarray) -> list[tf.Tensor]:
        """Per local replica, the words it receives, grouped by source.

        Args:
            send: Per local replica, int32 `[n, words]` rows grouped by destination.
            counts: `[R, R]` rows from each replica to each.
        """
        width = int(send[0].shape[1])
        function = self._functions.get(width)
        if function is None:
            function = self._functions[width] = self._compile(width)
        # In the gathered words, replica s's rows start at `starts[s]`; those
        # for d follow the ones it sends to the replicas before d.
        starts = np.cumsum(counts.sum(axis=1)) - counts.sum(axis=1)
        offsets = np.cumsum(counts, axis=1) - counts
        take = []
        for d, device in zip(self._local_ids, self._devices, strict=True):
            rows = np.concatenate(
                [np.arange(starts[s] + offsets[s, d], starts[s] + offsets[s, d] + counts[s, d])
                 for s in range(len(counts))]
            ).astype(np.int64)
            with tf.device(device):
                take.append(tf.constant(rows))
        return list(function(list(send), take))

    def _compile(self, width: int) -> Any:
        strategy, devices = self._strategy, self._devices
        first = self._local_ids[0]
        n_local = len(devices)

        def exchange(send: list[tf.Tensor], take: list[tf.Tensor]) -> list[tf.Tensor]:
            mine = strategy.experimental_distribute_values_from_function(
                lambda ctx: send[ctx.replica_id_in_sync_group - first]
            )
            everything = strategy.gather(mine, axis=0)
            out = []
            for rows, device in zip(take, devices, strict=True):
                with tf.device(device):
                    out.append(tf.gather(everything, rows))
            return out

        return tf.function(
            exchange,
            autograph=False,
            input_signature=[
                [tf.TensorSpec([None, width], tf.int32)] * n_local,
                [tf.TensorSpec([None], tf.int64)] * n_local,
            ],
        )


def to_words(rows: tf.Tensor) -> tf.Tensor:
    """`[n, ...]` rows of any dtype as `[n, words]` int32 (bytes padded to a
    word); `n` may be symbolic (inside a compiled function)."""
    if rows.dtype == tf.bool:
        rows = tf.cast(rows, tf.uint8)
    n = tf.shape(rows)[0]
    row_bytes = math.prod(rows.shape[1:]) * rows.dtype.size
    as_bytes = tf.bitcast(rows, tf.uint8) if rows.dtype != tf.uint8 else rows
    as_bytes = tf.reshape(as_bytes, [n, row_bytes])
    as_bytes = tf.pad(as_bytes, [[0, 0], [0, -row_bytes % 4]])
    return tf.bitcast(tf.reshape(as_bytes, [n, -1, 4]), tf.int32)


def from_words(words: tf.Tensor, like: Any) -> tf.Tensor:
    """Inverse of `to_words`: rows shaped and typed like `like`'s rows (a
    tensor or variable)."""
    n = tf.shape(words)[0]
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
