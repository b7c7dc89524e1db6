"""Who we are (rank, world_size, worker_id, num_workers) and which shards we read.

:func:`current_slot` is the only place that asks torch.distributed and the DataLoader; the
assignment itself is a pure function of the shard count, the seed and the epoch, so every
rank computes the same split without talking to the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = ["WorkerSlot", "assign_shards", "current_slot", "distributed_rank", "in_worker", "loader_id", "shard_order"]


@dataclass(frozen=True, kw_only=True)
class WorkerSlot:
    """One reader of the job: a DataLoader worker of a rank."""

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} must be in [0, world_size={self.world_size})")
        if not 0 <= self.worker_id < self.num_workers:
            raise ValueError(f"worker_id={self.worker_id} must be in [0, num_workers={self.num_workers})")

    @property
    def index(self) -> int:
        """This reader's position among all ``num_slots`` readers of the job."""
        return self.rank * self.num_workers + self.worker_id

    @property
    def num_slots(self) -> int:
        return self.world_size * self.num_workers


def distributed_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` from ``torch.distributed`` if it is initialised here, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def current_slot(parent_rank: tuple[int, int] | None = None) -> WorkerSlot:
    """This process's slot. Rank and world size come from ``torch.distributed`` when it is
    initialised in this process; else from ``parent_rank``, what the main process saw when it
    handed the dataset to a spawned DataLoader worker (which does not inherit the process
    group); else from the ``RANK`` / ``WORLD_SIZE`` variables torchrun sets; else 0 / 1.
    Worker id and count come from ``torch.utils.data.get_worker_info()``.

    Raises:
        ValueError: ``RANK`` / ``WORLD_SIZE`` are not integers or are inconsistent.
    """
    from torch.utils.data import get_worker_info

    found = distributed_rank() or parent_rank
    if found is not None:
        rank, world_size = found
    else:
        try:
            rank = int(os.environ.get("RANK", "0"))
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        except ValueError:
            raise ValueError(
                f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} "
                "must be integers (as torchrun sets them)"
            ) from None
    info = get_worker_info()
    worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)


def in_worker() -> bool:
    """Whether this process is a DataLoader worker."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def loader_id() -> int:
    """In a DataLoader worker: the base seed it shares with its siblings (not 0), which tells
    one DataLoader's workers from another's."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return ((info.seed - info.id) % (1 << 62)) or 1


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """All shard ids in this epoch's order: a permutation seeded by ``(seed, epoch)``, or
    ``0..num_shards-1`` without ``shuffle``. Identical on every rank."""
    if not shuffle:
        return list(range(num_shards))
    rng = np.random.default_rng([seed, epoch])
    return rng.permutation(num_shards).tolist()


def assign_shards(num_shards: int, slot: WorkerSlot, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Shard ids that ``slot`` reads in ``epoch``: every ``num_slots``-th shard of the epoch's
    order, starting at ``slot.index``. Each shard goes to exactly one slot, so every sample is
    read once per epoch; slots get equal sample counts when the shards hold equal counts and
    divide evenly among the slots."""
    return shard_order(num_shards, seed=seed, epoch=epoch, shuffle=shuffle)[slot.index :: slot.num_slots]
