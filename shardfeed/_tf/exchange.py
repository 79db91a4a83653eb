"""The global order of sharded rows on TensorFlow (`GlobalShuffle`): a per-epoch exchange.

Keeps the layout (the global row in each slot, the same on every rank), plans
each epoch's moves with `_data/exchange.py`, moves them through the engine's
`all_to_all` before the epoch's first step, and hands the loop index matrices
into the slots. Bytes and seconds are logged on the chief and kept in `reports`.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data import exchange as _exchange
from shardfeed._data import order as _data_order
from shardfeed._data import plan as _plan
from shardfeed._data.options import LoadOptions
from shardfeed._data.plan import ShardPlan
from shardfeed._tf import order as _order
from shardfeed._tf import storage as _storage
from shardfeed._tf.engines import alltoall as _alltoall
from shardfeed._tf.engines.engine import Engine
from shardfeed._tf.world import World

logger = logging.getLogger("shardfeed")


@dataclasses.dataclass(frozen=True)
class ExchangeReport:
    """One epoch's exchange, seen from this worker.

    Attributes:
        epoch: The epoch the rows were moved for.
        rows_sent: Per local replica, rows it sent (it received as many).
        bytes_sent: Per local replica, bytes it sent (all columns).
        seconds: Wall time of the exchange on this worker.
        rounds: Rounds of at most `exchange_buffer_bytes` of staging.
        traces: Compiled functions traced during this exchange (packing,
            unpacking, the engine's all-to-all): each once in the first
            exchange, none after, however many rounds.
    """

    epoch: int
    rows_sent: tuple[int, ...]
    bytes_sent: tuple[int, ...]
    seconds: float
    rounds: int
    traces: int = 0

    @property
    def gb_per_s(self) -> float:
        """Bytes sent per replica (the largest) per second, in GB/s."""
        return max(self.bytes_sent, default=0) / max(self.seconds, 1e-12) / 1e9


def staging_bytes(plan: ShardPlan, row_bytes: int, options: LoadOptions, world: World) -> int:
    """Device bytes per replica the exchange may stage in this world."""
    return _exchange.staging_bytes(
        plan, row_bytes, _exchange.buffer_bytes(options.exchange_buffer_bytes, plan, row_bytes),
        _staged_rows_per_row(world),
    )


def _staged_rows_per_row(world: World) -> int:
    return _exchange.staged_rows_per_row(
        world.num_replicas_in_sync, world.world_size, world.backend
    )


def misfit_error(
    numbers: str, options: LoadOptions, streaming_asked: bool, buffer_bytes: int
) -> str:
    """The refusal when globally shuffled sharded rows (and their staging)
    do not fit, or would stream (`buffer_bytes`: the exchange's buffer as
    resolved, `exchange.buffer_bytes`)."""
    return _errors.message(
        "The global shuffle (shuffle=True) of sharded rows needs every shard resident, "
        "plus a staging buffer of at most `LoadOptions.exchange_buffer_bytes` per replica "
        "for the per-epoch exchange; a streamed shard has no global order.",
        f"{numbers}, exchange_buffer_bytes={buffer_bytes}"
        if numbers
        else f"streaming={options.streaming!r}, shuffle=True",
        'Pass shuffle="local" (each replica shuffles its own rows; a shard that does '
        "not fit then streams with a chunk-then-row shuffle), use more replicas, or "
        "lower `LoadOptions.exchange_buffer_bytes`."
        if not streaming_asked
        else 'Pass shuffle="local" to stream with a chunk-then-row shuffle, or '
        "`LoadOptions(streaming=False)` to hold the shard resident.",
    )


class GlobalShuffle:
    """The layout of sharded rows across replicas and the per-epoch exchange
    (the `order.Residency` of sharded rows that follow one order of all rows:
    globally shuffled, or in order; `_plan.uses_exchange`).

    Args:
        plan: The dataset's evaluation plan (which rows each replica holds).
        stores: This worker's replicas' storage.
        engine: The dataset's engine (its world says which replicas are local).
        row_bytes: Bytes of one row, all columns.
        options: `exchange_buffer_bytes`, `exchange_fraction`.
        seed: The dataset's seed.
        shuffle: True: one permutation of all rows per epoch; False: rows in
            order (they move once, before the first training epoch, and stay).
    """

    def __init__(
        self,
        plan: ShardPlan,
        stores: tuple[_storage.ReplicaStore, ...],
        engine: Engine,
        row_bytes: int,
        options: LoadOptions,
        seed: int | None,
        shuffle: bool = True,
    ) -> None:
        self.held = _exchange.initial_layout(plan)
        self.reports: list[ExchangeReport] = []
        self._stores, self._engine, self._world = stores, engine, engine.world
        self._row_bytes, self._options, self._seed = row_bytes, options, seed
        self._shuffle = shuffle
        self._buffer_bytes = _exchange.buffer_bytes(options.exchange_buffer_bytes, plan, row_bytes)
        self._num_rows = plan.num_rows
        self._moves: _RoundMoves | None = None

    streamed = False

    def exclusive(self, training: bool) -> bool:
        """A training epoch moves rows: every open epoch's slots go stale."""
        return training

    def epoch_order(self, plan: ShardPlan, epoch: int, training: bool) -> _order.EpochOrder:
        """Moves the rows for a training epoch, then returns its order.

        Evaluation epochs read the slots as they are (each row once, in slot
        order); `EpochOrder.rows` maps slots back to global rows.
        """
        if not training:
            indices = _order.epoch_indices(plan, self._stores, None, epoch, False)
            return _order.EpochOrder(indices, self._stores, self._local_layout())
        fraction = self._options.exchange_fraction
        if _plan.partial_exchange(self._shuffle, plan, fraction):
            assert self._seed is not None  # a shuffle needs one: checked when built
            dest = _exchange.partial_destinations(
                self.held, fraction, self._seed, epoch, self._num_rows
            )
            self._move(dest, epoch)
            return _order.EpochOrder(
                self._mixed_indices(plan, epoch), self._stores, self._local_layout()
            )
        # Host arrays of a row each, freed as soon as the next one is made: on
        # narrow rows (128 bytes) each int64 one was 6% of the rows, and they
        # had added up to 0.4x during the exchange.
        needed = _data_order.global_rows(plan, self._shuffle, self._seed, epoch)
        self._move(_exchange.global_destinations(self.held, needed, self._num_rows), epoch)
        dtype = _exchange.row_dtype(self._num_rows)
        slot = np.empty(self._num_rows, dtype=dtype)
        for rows in self.held:
            slot[rows] = np.arange(len(rows), dtype=dtype)
        indices = []
        for store in self._stores:
            indices.append(_order.index_matrix(plan, slot[needed[store.replica]], store.device))
        del slot, needed
        return _order.EpochOrder(indices, self._stores, self._local_layout())

    def _mixed_indices(self, plan: ShardPlan, epoch: int) -> list[tf.Tensor]:
        """A partially exchanged epoch's index matrices: each replica's rows
        as the neutral order permutes them (`_data/order.mixed_order`, over
        the rows it holds, ascending: JAX's order), as the slots they sit in."""
        return [
            _order.index_matrix(plan, self._mixed_slots(plan, epoch, s.replica), s.device)
            for s in self._stores
        ]

    def _mixed_slots(self, plan: ShardPlan, epoch: int, replica: int) -> np.ndarray:
        assert self._seed is not None  # a shuffle needs one: checked when built
        held = self.held[replica]
        by_row = np.argsort(held, kind="stable").astype(held.dtype)  # slots, rows ascending
        count = plan.rows_per_epoch(replica)
        return by_row[_data_order.mixed_order(held, self._seed, epoch, replica, count)]

    def _local_layout(self) -> list[np.ndarray]:
        return [self.held[s.replica].copy() for s in self._stores]

    def _move(self, dest: np.ndarray, epoch: int) -> None:
        if self._moves is None:
            self._moves = _RoundMoves(self._stores)
        engine, moves = self._engine, self._moves
        traced = moves.tracing_count + engine.exchange_tracing_count
        # Rounds are sized by the words that cross (every column padded to a
        # word), so one round stages at most the buffer.
        k = _exchange.round_rows(
            self._buffer_bytes, 4 * moves.words_per_row,
            _staged_rows_per_row(self._world),
        )
        began = time.perf_counter()
        num_rounds, sent_rows = 0, np.zeros(len(self.held), dtype=np.int64)
        for rnd in _exchange.iter_rounds(self.held, dest, k):
            num_rounds += 1
            sent_rows += rnd.counts.sum(axis=1)
            slots = []
            for store in self._stores:
                with tf.device(store.device):
                    slots.append(tf.constant(rnd.send_slots[store.replica], tf.int64))
            # One all-to-all per round carries every column.
            moves.unpack(slots, engine.all_to_all(moves.pack(slots), rnd.counts))
            _exchange.apply_round(self.held, rnd)
        if num_rounds:
            for store in self._stores:  # wait for the last writes (devices run async)
                store.variables[-1].sparse_read([0]).numpy()
        seconds = time.perf_counter() - began
        sent = tuple(int(sent_rows[s.replica]) for s in self._stores)
        report = ExchangeReport(
            epoch, sent, tuple(n * self._row_bytes for n in sent), seconds, num_rounds,
            moves.tracing_count + engine.exchange_tracing_count - traced,
        )
        self.reports.append(report)
        if self._world.is_chief:
            logger.info(
                "shardfeed: epoch %d exchange: %d rows (%.1f MB) sent per replica in %.3f s "
                "(%.2f GB/s, %d round(s)).",
                epoch, max(sent, default=0), max(report.bytes_sent, default=0) / 1e6,
                seconds, report.gb_per_s, num_rounds,
            )


class _RoundMoves:
    """A round's two local halves, compiled once with a symbolic row count:
    `pack` gathers the sent slots of every column as int32 words `[n, words]`
    per local replica, `unpack` writes arrivals into the same slots. Eager,
    each column cost about ten ops per replica per round.

    Args:
        stores: This worker's replicas' storage.
    """

    def __init__(self, stores: tuple[_storage.ReplicaStore, ...]) -> None:
        variables = stores[0].variables
        widths = [_alltoall.words_per_row(v.shape[1:], v.dtype) for v in variables]
        self.words_per_row = sum(widths)
        slots_spec = [tf.TensorSpec([None], tf.int64)] * len(stores)
        words_spec = [tf.TensorSpec([None, self.words_per_row], tf.int32)] * len(stores)

        def pack(slots: list[tf.Tensor]) -> list[tf.Tensor]:
            out = []
            for store, rows in zip(stores, slots, strict=True):
                with tf.device(store.device):
                    out.append(tf.concat(
                        [_alltoall.to_words(tf.gather(v, rows)) for v in store.variables], axis=1
                    ))
            return out

        def unpack(slots: list[tf.Tensor], received: list[tf.Tensor]) -> None:
            for store, rows, words in zip(stores, slots, received, strict=True):
                with tf.device(store.device):
                    columns = tf.split(words, widths, axis=1)
                    for v, column in zip(store.variables, columns, strict=True):
                        v.scatter_update(tf.IndexedSlices(_alltoall.from_words(column, v), rows))

        self.pack = tf.function(pack, input_signature=[slots_spec], autograph=False)
        self.unpack = tf.function(
            unpack, input_signature=[slots_spec, words_spec], autograph=False
        )

    @property
    def tracing_count(self) -> int:
        return self.pack.experimental_get_tracing_count() + (
            self.unpack.experimental_get_tracing_count()
        )
