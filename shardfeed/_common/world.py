"""What the backend-neutral modules use of a backend's `World` (`WorldLike`), and the
replica numbering both backends' worlds share (`ReplicaNumbering`)."""

from __future__ import annotations

from typing import Protocol


class WorldLike(Protocol):
    """Either backend's `World`, as the neutral modules see it."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def is_chief(self) -> bool: ...

    def all_gather_bytes(self, payload: bytes, /) -> list[bytes]: ...


class ReplicaNumbering:
    """Global replica `g = rank * replicas_in_process + i`, every worker
    holding as many replicas; worker 0 is the chief (the one that writes
    files and prints). Mixed into each backend's `World`, which provides
    `rank` and `replicas_in_process`."""

    rank: int

    @property
    def replicas_in_process(self) -> int:
        raise NotImplementedError

    @property
    def global_replica_ids(self) -> tuple[int, ...]:
        first = self.rank * self.replicas_in_process
        return tuple(range(first, first + self.replicas_in_process))

    @property
    def is_chief(self) -> bool:
        """Whether this is worker 0, the one that writes files and prints."""
        return self.rank == 0
