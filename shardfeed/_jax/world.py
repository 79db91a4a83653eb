"""The world on JAX: who this process is, its replicas' devices and the one-axis `mesh`.

Replicas are JAX devices ordered by process, then local device, so global
replica `g = rank * replicas_in_process + i` as on TensorFlow; `barrier` and
`all_gather_bytes` are the two tiny collectives every layer may use.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardfeed._common.world import ReplicaNumbering

REPLICA_AXIS = "replica"


@dataclasses.dataclass(frozen=True)
class World(ReplicaNumbering):
    """Where this process sits among the workers and replicas, on JAX.

    Attributes:
        rank: This worker's index among `world_size` workers (`jax.process_index()`).
        world_size: Number of workers (`jax.process_count()` of the job).
        local_rank: This worker's index among workers on the same host.
        devices: Every replica's device, in global replica order (all workers').
        backend: Always `"jax"`.
    """

    rank: int
    world_size: int
    local_rank: int
    devices: tuple[Any, ...]
    backend: Literal["jax"] = "jax"

    def __post_init__(self) -> None:
        if len(self.devices) % self.world_size:
            raise ValueError(
                f"Every worker must hold as many replicas. Received: devices={len(self.devices)}, "
                f"world_size={self.world_size}. Give every process the same number of devices."
            )

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Nothing to enter on JAX (a model's variables are placed by the loop);
        kept so one script runs on both backends."""
        yield

    @property
    def replicas_in_process(self) -> int:
        return len(self.devices) // self.world_size

    @property
    def local_devices(self) -> tuple[Any, ...]:
        """This worker's replicas' devices, in local replica order."""
        first = self.rank * self.replicas_in_process
        return self.devices[first : first + self.replicas_in_process]

    @property
    def num_replicas_in_sync(self) -> int:
        return len(self.devices)

    @property
    def mesh(self) -> Mesh:
        """A one-axis mesh (`REPLICA_AXIS`) over every replica's device."""
        return _mesh(self.devices)

    def barrier(self) -> None:
        """Waits until every worker has reached its `barrier()` call (nothing
        with one worker). Every worker must call it the same number of times."""
        if self.world_size > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("shardfeed_barrier")

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every worker's `payload`, in rank order, on every worker (two tiny
        collectives: the lengths, then the bytes padded to the longest)."""
        if self.world_size == 1:
            return [payload]
        from jax.experimental import multihost_utils

        lengths = np.asarray(
            multihost_utils.process_allgather(np.array([len(payload)], np.int32))
        ).reshape(self.world_size)
        if not lengths.any():
            return [b""] * self.world_size
        row = np.zeros(-(-int(lengths.max()) // 4) * 4, np.uint8)
        row[: len(payload)] = np.frombuffer(payload, np.uint8)
        rows = np.asarray(multihost_utils.process_allgather(row.view(np.int32)))
        rows = rows.reshape(self.world_size, -1)
        return [rows[r].tobytes()[: int(lengths[r])] for r in range(self.world_size)]


def replicated(value: Any, mesh: Mesh) -> jax.Array:
    """`value` (the same on every process) on every device of `mesh`, built
    from this process's devices alone. Why not `jax.device_put(value,
    NamedSharding(mesh, P()))`: across processes that runs a collective
    (`multihost_utils.assert_equal`), and from the streaming upload thread it
    met the main thread's collectives out of order (a hang, a Gloo
    "collective mismatch", garbage in `all_gather_bytes`)."""
    sharding = NamedSharding(mesh, P())
    devices = sorted(sharding.addressable_devices, key=lambda d: d.id)
    return jax.make_array_from_single_device_arrays(
        np.shape(value), sharding, [jax.device_put(value, d) for d in devices]
    )


_meshes: dict[tuple[Any, ...], Mesh] = {}


def _mesh(devices: tuple[Any, ...]) -> Mesh:
    # One Mesh object per device tuple, so compiled calls keyed on it are reused.
    if devices not in _meshes:
        _meshes[devices] = Mesh(np.array(devices, dtype=object), (REPLICA_AXIS,))
    return _meshes[devices]


def ordered_devices(devices: Any) -> tuple[Any, ...]:
    """`devices` in global replica order: by process, then by local id."""
    return tuple(sorted(devices, key=lambda d: (d.process_index, d.id)))


# The world `shardfeed.init` returned last (as on TensorFlow).
_initialized: list[World] = []


def remember_initialized(world: World) -> None:
    """Records the world `shardfeed.init` started."""
    _initialized[:] = [world]


def initialized_world() -> World | None:
    """The world `shardfeed.init` returned last, or None if it was never called."""
    return _initialized[0] if _initialized else None


def current_world() -> World:
    """Describes this process: the world `shardfeed.init` started; else the
    devices of a `keras.distribution.DataParallel` in effect; else, in a
    `jax.distributed` job, every device of the job; else one local device
    (as Keras on JAX trains without a distribution).

    Example:
        >>> current_world().num_replicas_in_sync
        1
    """
    world = initialized_world()
    if world is not None:
        return world
    import keras

    distribution = keras.distribution.distribution()
    if distribution is not None and isinstance(distribution, keras.distribution.DataParallel):
        devices = ordered_devices(distribution.device_mesh.devices.flatten().tolist())
        count = len({d.process_index for d in devices})
        return World(jax.process_index() if count > 1 else 0, count, 0, devices)
    if jax.process_count() > 1:
        return World(jax.process_index(), jax.process_count(), 0, ordered_devices(jax.devices()))
    return World(0, 1, 0, (jax.local_devices()[0],))
