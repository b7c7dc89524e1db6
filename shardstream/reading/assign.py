"""Who we are (rank, world_size, worker_id, num_workers) and which shards we read.

:func:`current_slot` is the only place that asks torch.distributed and the DataLoader, and it
asks them without importing torch (:func:`loaded_torch`); the assignment itself is a pure
function of the shard count, the seed and the epoch, so every rank computes the same split
without talking to the others.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import torchrun_env

__all__ = [
    "NodeAffinity",
    "WorkerSlot",
    "assign_shards",
    "current_slot",
    "distributed_rank",
    "in_worker",
    "loaded_torch",
    "loaded_torch_version",
    "loader_id",
    "shard_order",
]


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


@dataclass(frozen=True)
class NodeAffinity:
    """``ShardDataset(shard_affinity="node")``: each node reads the same share of the dataset
    in every epoch (shuffled within the node, across its ranks and workers, anew each epoch),
    so once its share is in its node cache, no epoch after the first reads from the store.

    Args:
        ranks_per_node: ranks on each node; None: torchrun's ``LOCAL_WORLD_SIZE``, read when
            the dataset is made (without it, all ranks count as one node). Ranks
            ``n * ranks_per_node ..`` are node ``n``, as torchrun numbers them (``GROUP_RANK``).

    Raises:
        ValueError: ``ranks_per_node`` (or ``LOCAL_WORLD_SIZE``) is not an int >= 1.
    """

    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        n = self.ranks_per_node
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise ValueError(f"NodeAffinity(ranks_per_node={n!r}) must be an int >= 1 or None (LOCAL_WORLD_SIZE)")

    @classmethod
    def of(cls, value: object, *, replication: int = 1) -> NodeAffinity | None:
        """``shard_affinity``'s value as an affinity whose ``ranks_per_node`` counts readers
        (with ``replication`` k, data-parallel groups: ranks / k), resolved now from the
        environment where not given; None for None.

        Raises:
            ValueError: another value, a bad ``LOCAL_WORLD_SIZE``, or ranks per node that
                are not a multiple of ``replication``.
        """
        if value is None:
            return None
        if value == "node":
            value = cls()
        if not isinstance(value, NodeAffinity):
            raise ValueError(f"shard_affinity={value!r} must be None, 'node' or NodeAffinity(ranks_per_node=...)")
        ranks = value.ranks_per_node
        raw = torchrun_env().local_world_size
        if ranks is None and raw is not None:
            try:
                ranks = int(raw)
            except ValueError:
                raise ValueError(f"LOCAL_WORLD_SIZE={raw!r} must be an int (as torchrun sets it)") from None
            cls(ranks)  # checks it
        if ranks is not None and ranks % replication:
            raise ValueError(
                f"shard_affinity='node' with {ranks} ranks per node and replication={replication}: a node must "
                "hold whole model-parallel groups"
            )
        return cls(None if ranks is None else ranks // replication)


def loaded_torch(module: str = "torch") -> Any | None:
    """torch's ``module`` (``"torch.distributed"`` ...) where this process has loaded it, else
    None; never imports it. The reader asks torch only this way (nothing in
    :mod:`shardstream.reading` imports torch), which loses nothing: a DataLoader worker runs
    torch's worker loop (``torch.utils.data`` is loaded), a process group exists only once
    ``torch.distributed`` was imported to make it, and a DataLoader reading a dataset is
    torch's. Where torch is not loaded, the answers are a plain process's: not distributed,
    not a DataLoader worker. (``sys.modules[name] = None``, which makes an import fail,
    counts as not loaded.)"""
    return sys.modules.get(module)


def loaded_torch_version() -> str | None:
    """``torch.__version__`` of the torch loaded here (e.g. ``"2.13.0+cpu"``), else None."""
    version = getattr(loaded_torch(), "__version__", None)
    return str(version) if version is not None else None


def _worker_info() -> Any | None:
    """``torch.utils.data.get_worker_info()`` in a DataLoader worker; None elsewhere."""
    get = getattr(loaded_torch("torch.utils.data"), "get_worker_info", None)
    return get() if get is not None else None


def distributed_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` from ``torch.distributed`` if it is initialised here, else None
    (also where this process never loaded torch.distributed: :func:`loaded_torch`)."""
    dist = loaded_torch("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def current_slot(parent_rank: tuple[int, int] | None = None) -> WorkerSlot:
    """This process's slot. Rank and world size come from ``torch.distributed`` when it is
    initialised in this process; else from ``parent_rank``, what the main process saw when it
    handed the dataset to a spawned DataLoader worker (which does not inherit the process
    group); else from the ``RANK`` / ``WORLD_SIZE`` variables torchrun sets; else 0 / 1.
    Worker id and count come from ``torch.utils.data.get_worker_info()`` (0 of 1 outside a
    DataLoader worker). torch is asked only where this process loaded it (:func:`loaded_torch`).

    Raises:
        ValueError: ``RANK`` / ``WORLD_SIZE`` are not integers or are inconsistent.
    """
    found = distributed_rank() or parent_rank
    if found is not None:
        rank, world_size = found
    else:
        launched = torchrun_env()
        try:
            rank = int(launched.rank or "0")
            world_size = int(launched.world_size or "1")
        except ValueError:
            raise ValueError(
                f"RANK={launched.rank!r} / WORLD_SIZE={launched.world_size!r} must be integers (as torchrun sets them)"
            ) from None
    info = _worker_info()
    worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return WorkerSlot(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)


def in_worker() -> bool:
    """Whether this process is a DataLoader worker (never where torch is not loaded)."""
    return _worker_info() is not None


def loader_id() -> int:
    """In a DataLoader worker: the base seed it shares with its siblings (not 0), which tells
    one DataLoader's workers from another's.

    Raises:
        RuntimeError: this process is not a DataLoader worker.
    """
    info = _worker_info()
    if info is None:
        raise RuntimeError("loader_id() is asked in a DataLoader worker only (see in_worker())")
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
