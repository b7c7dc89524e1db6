"""The epoch schedule: which samples each rank and worker reads in an epoch, how many, and the
checkpoint state that resumes it. No torch: who is asking comes in as a
:class:`~shardstream.reading.assign.WorkerSlot`, which pass as a
:class:`~shardstream.reading.epochs.PassState`.

:class:`EpochSchedule` holds the settings that fix an epoch's order (seed, shuffle, shuffle
buffer, lanes, ``drop_last``, the DataLoader's batch size) and the shards' sample counts, and
answers, all O(shards) or O(workers), never O(samples):

- :meth:`~EpochSchedule.shard_order`: the epoch's permutation of shards (kept for the two
  latest epochs, so DataLoader workers forked after ``set_epoch`` or ``len`` inherit it);
- :meth:`~EpochSchedule.plan` / :meth:`~EpochSchedule.worker_plan`: the epoch's
  :class:`~shardstream.reading.plan.EpochPlan` and one worker's piece of it;
- :meth:`~EpochSchedule.rank_count`: ``len(dataset)``, the same on every rank;
- :meth:`~EpochSchedule.reader_state` / :meth:`~EpochSchedule.consumed_state`: a checkpoint
  as a few numbers; :meth:`~EpochSchedule.loaded_state`: one checked before it is resumed;
- :meth:`~EpochSchedule.shard_ids`: for bare shard URLs (no counts), every
  ``num_slots``-th shard of the epoch's order.

A mixture's schedule, and the choice of schedule for a list of sources, are in
:mod:`.mixschedule`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..config import OrderSettings, torchrun_env
from ..tarstream import Batch
from .assign import NodeAffinity, WorkerSlot, assign_shards
from .engine import ReadingEngine
from .epochs import PassState
from .filerun import FileRun
from .mixture import Source
from .plan import EpochPlan, NodeLayout, Segment, ShardOrder, WorkerPlan, per_rank
from .shards import ShardSet

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "EpochSchedule",
    "Plan",
    "Schedule",
    "segments_of",
]

log = logging.getLogger("shardstream")

STATE_FORMAT = "shardstream-state"
STATE_VERSION = 1


class Plan(Protocol):
    """An epoch's plan, of one dataset (:class:`~.plan.EpochPlan`) or of a mixture
    (:class:`~.mixplan.MixturePlan`): the one shape the schedules and the reader use."""

    @property
    def num_samples(self) -> int: ...

    def for_worker(self, *, rank: int, world_size: int, worker_id: int, num_workers: int) -> tuple[Any, int]:
        """One worker's piece of the epoch (a :class:`~.plan.WorkerPlan` or a
        :class:`~.mixplan.MixWorkerPlan`) and the index of the checkpoint segment it reads."""
        ...

    def rank_count(self, *, world_size: int, num_workers: int, rank: int = 0) -> int:
        """Samples ``rank`` yields in the epoch (the same on every rank)."""
        ...


class Schedule:
    """What the epoch schedules of one dataset and of a mixture share, and the questions the
    reader asks both alike (so nothing above them asks which one it has): a plan per pass, a
    worker's piece of it read by the engines, ``len``, and checkpoints.

    Attributes:
        names: the sources' names, in order (a mixture's), or ``()`` (one dataset).
        num_samples: samples of an epoch (None for bare shard URLs).
        num_shards: shards in all.
    """

    names: tuple[str, ...] = ()
    sources: list[Source] | None = None  # a mixture's
    unit: str = "sample"  # what it counts (an ItemUnit's name); checkpoints name any other

    def prepare(self, epoch: int, slot: WorkerSlot | None = None) -> None:
        """Compute ``epoch``'s order now (O(shards)) for the job ``slot`` is in, so DataLoader
        workers forked next inherit it."""
        raise NotImplementedError

    def plan(self, state: PassState, slot: WorkerSlot | None = None) -> Plan:
        """The plan of the pass ``state`` (its epoch, resumed from its checkpoint segments) for
        the job ``slot`` is in (its world size sets the nodes' shares under node affinity)."""
        raise NotImplementedError

    def read_worker(
        self, mine: Any, epoch: int, engines: Sequence[ReadingEngine], **read: Any
    ) -> Iterator[Batch | FileRun]:
        """A worker's piece ``mine`` of ``epoch``'s plan, read by ``engines`` (one a source);
        ``read``: :meth:`~.engine.ReadingEngine.read_plan`'s ``fetch``, ``stats`` and ``file_runs``."""
        raise NotImplementedError

    def loaded_state(self, state: dict[str, Any]) -> PassState:
        """The pass a checkpoint resumes, once checked against these shards and settings."""
        raise NotImplementedError

    @property
    def per_source(self) -> dict[str, int]:
        """Samples each source gives one epoch, by name (empty for one dataset)."""
        return {}

    @property
    def epoch_varies(self) -> bool:
        """Whether one epoch differs from another (in order or in samples): with ``shuffle``."""
        return self.shuffle

    @property
    def whole_sources(self) -> bool:
        """Whether an epoch reads the data whole, once (true for one dataset)."""
        return True

    def check_lookup(self, what: str) -> None:
        """The one place that refuses to look samples up by global index or key in a mixture
        whose epochs are not its sources laid end to end (``weight=``, ``samples=``, or a
        ``repeat`` other than 1: no index there means one sample).

        Raises:
            TypeError: such a mixture, saying what to do instead.
        """
        if self.sources is not None and not self.whole_sources:
            raise TypeError(
                f"{what} reads one dataset or a mixture of whole sources (repeat=1), not a mixture of "
                f"{len(self.sources)} sources read in parts (weight=, samples=, repeat!=1); open each source's "
                "location with ShardDataset(location) or ShardMapDataset(location)"
            )

    def _keep(
        self,
        counts: np.ndarray | None,
        num_shards: int,
        order: OrderSettings | None,
        shard_affinity: NodeAffinity | None = None,
        **settings: Any,
    ) -> None:
        """Hold the item counts and the settings that fix an epoch's order (``order``, or
        its fields as keywords, as callers before :class:`~shardstream.config.OrderSettings`
        passed them)."""
        order = order if order is not None else OrderSettings(**settings)
        self.order = order
        self.counts: np.ndarray | None = counts
        self.num_shards = num_shards
        self.num_samples: int | None = int(counts.sum()) if counts is not None else None
        self.seed = order.seed
        self.shuffle = order.shuffle
        self.shuffle_buffer = order.shuffle_buffer
        self.max_open_shards = order.max_open_shards
        self.drop_last = order.drop_last
        self.batch_size = order.batch_size
        self.shard_affinity = shard_affinity

    def _plan_args(self, state: PassState) -> dict[str, Any]:
        """What a plan of the pass ``state`` takes from these settings."""
        return {
            "seed": self.seed,
            "epoch": state.epoch,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer if self.shuffle else 0,
            "max_open_shards": self.max_open_shards if self.shuffle else 1,
            "drop_last": self.drop_last,
            "segments": segments_of(state),
            "batch_size": self.batch_size,
        }

    @staticmethod
    def worker_plan(plan: Plan, slot: WorkerSlot) -> tuple[Any, int]:
        """``slot``'s piece of ``plan`` and the index of the segment it reads
        (:meth:`EpochPlan.for_worker`).

        Raises:
            ValueError: the checkpoint the plan resumes cannot be split for this slot.
        """
        return plan.for_worker(
            rank=slot.rank, world_size=slot.world_size, worker_id=slot.worker_id, num_workers=slot.num_workers
        )

    def rank_count(self, upcoming: PassState, slot: WorkerSlot) -> int:
        """Samples ``slot.rank`` yields in the pass ``upcoming``: the same on every rank. After
        a ``samples_consumed`` checkpoint: those still to come in its epoch; after a
        ``StatefulDataLoader`` one, the epoch's whole count."""
        segments = segments_of(upcoming)
        num_workers = 1
        if segments and segments[-1].world_size == slot.world_size:
            num_workers = segments[-1].num_workers
        plan = self.plan(PassState(upcoming.epoch, upcoming.segments or []), slot)
        return plan.rank_count(world_size=slot.world_size, num_workers=num_workers, rank=slot.rank)

    def shard_ids(self, slot: WorkerSlot, epoch: int) -> list[int]:
        """Shard ids ``slot`` reads in ``epoch`` without a plan (bare shard URLs)."""
        return assign_shards(self.num_shards, slot, seed=self.seed, epoch=epoch, shuffle=self.shuffle)

    def reader_state(
        self, state: PassState, slot: WorkerSlot, *, position: tuple[int, int] | None, yielded: int
    ) -> dict[str, Any]:
        """The checkpoint of one reader (``StatefulDataLoader`` calls ``state_dict()`` in each
        worker): it has yielded ``yielded`` samples of its pass ``state``, whose piece is segment
        ``position[0]`` of the epoch, ``position[1]`` of its samples skipped as read before a
        resume (None: no pass in progress). Resumes at the same world_size and num_workers."""
        segments = segments_of(state)
        seg, skip = position if position else (len(segments), 0)
        workers = max(1, slot.num_workers)
        current = Segment(
            slot.world_size,
            workers,
            worker_yielded=((slot.worker_id, skip + yielded),),
            split_batch_size=self.batch_size,
        )
        return self._state_dict(state.epoch, [*segments[:seg], current])

    def consumed_state(
        self,
        state: PassState,
        slot: WorkerSlot,
        *,
        samples_consumed: int,
        batch_size: int | None,
        num_workers: int | None,
    ) -> dict[str, Any]:
        """The checkpoint of a rank that took ``samples_consumed`` samples from the DataLoader
        iterator of the pass ``state`` (``batch_size`` and ``num_workers`` its DataLoader's).
        Resumes at the same or another world size.

        Raises:
            ValueError: the epoch was resumed from, or is being saved as, the other kind of
                checkpoint, or with another batch size.
        """
        workers = max(1, num_workers or 0)
        if state.segments is None:
            raise ValueError(
                "the DataLoader workers resumed this epoch from a StatefulDataLoader checkpoint; keep saving "
                "with StatefulDataLoader.state_dict() for this epoch"
            )
        segments = segments_of(state)
        seg, base = len(segments), 0
        last = segments[-1] if segments else None
        if last is not None and (last.world_size, last.num_workers, last.split_batch_size) == (
            slot.world_size,
            workers,
            self.batch_size,
        ):
            if last.samples_consumed is None:
                raise ValueError(
                    "the loaded checkpoint came from StatefulDataLoader workers; keep saving with "
                    "StatefulDataLoader.state_dict() for this epoch"
                )
            if last.batch_size != batch_size:
                raise ValueError(
                    f"batch_size={batch_size} differs from the checkpoint's {last.batch_size}; resume "
                    "an epoch with the DataLoader batch size it started with"
                )
            seg, base = len(segments) - 1, last.samples_consumed
        current = Segment(
            slot.world_size, workers, batch_size, base + samples_consumed, split_batch_size=self.batch_size
        )
        return self._state_dict(state.epoch, [*segments[:seg], current])

    def _state_dict(self, epoch: int, segments: list[Segment]) -> dict[str, Any]:
        return (
            self._affinity_key()
            | self._unit_key()
            | {
                "format": STATE_FORMAT,
                "version": STATE_VERSION,
                "seed": self.seed,
                "epoch": epoch,
                "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer,
                "max_open_shards": self.max_open_shards,
                "drop_last": self.drop_last,
                "num_samples": self.num_samples,
                "num_shards": self.num_shards,
                "segments": [x.to_dict() for x in segments],
            }
        )

    def _unit_key(self) -> dict[str, Any]:
        """What a checkpoint records of the item unit: its name, where items are not samples."""
        return {"unit": self.unit} if self.unit != "sample" else {}

    def _affinity_key(self) -> dict[str, Any]:
        """What a checkpoint records of node affinity: only that it is on (the ranks per node
        may differ at a resume: an elastic one re-partitions the nodes' shares)."""
        return {"shard_affinity": "node"} if self.shard_affinity is not None else {}

    def _checked(self, state: dict[str, Any], mine: dict[str, Any], saved: str) -> tuple[int, list[dict[str, Any]]]:
        """A checkpoint's epoch and segments, once its format, version, ``mine`` and the
        settings that fix an order match this schedule's.

        Raises:
            ValueError: it does not (each difference named; ``saved`` says how it was saved).
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f'not a shardstream state (no "format": "{STATE_FORMAT}"): {str(state)[:200]}')
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"state version {state.get('version')!r} is not supported (reads {STATE_VERSION})")
        mine = {
            **mine,
            "shard_affinity": self._affinity_key().get("shard_affinity"),
            "unit": self._unit_key().get("unit"),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "max_open_shards": self.max_open_shards,
            "drop_last": self.drop_last,
        }
        differ = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if differ:
            detail = ", ".join(f"{k}: checkpoint {a!r}, dataset {b!r}" for k, (a, b) in differ.items())
            raise ValueError(f"the state was saved {saved} ({detail}); construct the same")
        return int(state["epoch"]), [Segment.from_dict(x).to_dict() for x in state["segments"]]  # validates them


class EpochSchedule(Schedule):
    """The epoch schedule of a dataset's shards (module doc).

    Args:
        shards: the shards; their ``sample_counts`` (None for bare shard URLs: then only
            :meth:`shard_ids` answers).
        seed: seed of shard order and sample shuffle.
        shuffle: permute shards, interleave lanes, shuffle samples; False keeps index order.
        shuffle_buffer: samples in each worker's shuffle buffer.
        max_open_shards: lanes (shards read at once) per worker.
        drop_last: drop the fewest samples instead of repeating them to even out ranks.
        batch_size: the DataLoader's batch size workers' pieces are cut by; None: evenly.
    """

    def __init__(
        self,
        shards: ShardSet,
        order: OrderSettings | None = None,
        *,
        shard_affinity: NodeAffinity | None = None,
        **settings: Any,
    ) -> None:
        self._keep(shards.sample_counts, shards.num_shards, order, shard_affinity, **settings)
        self._orders: dict[tuple[int, NodeLayout | None], ShardOrder] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_orders"] = {}  # O(shards) arrays a spawned worker remakes for its epoch
        return state

    def node_layout(self, world_size: int | None) -> NodeLayout | None:
        """Node affinity's layout for a job of ``world_size`` readers (ranks, or groups with
        replication); None without affinity or a known world size.

        Raises:
            ValueError: ``world_size`` is not a multiple of the ranks per node.
        """
        if self.shard_affinity is None or world_size is None or self.num_samples is None:
            return None
        ranks = self.shard_affinity.ranks_per_node or world_size
        if world_size % ranks:
            raise ValueError(
                f"shard_affinity='node': world_size={world_size} is not a multiple of {ranks} ranks per node "
                "(LOCAL_WORLD_SIZE, or NodeAffinity(ranks_per_node=...)); every node needs the same number of ranks"
            )
        return NodeLayout(world_size // ranks, ranks, per_rank(self.num_samples, world_size, drop_last=self.drop_last))

    def shard_order(self, epoch: int, world_size: int | None = None) -> ShardOrder:
        """``epoch``'s order of shards, O(shards): kept for the two latest epochs, so workers
        forked after ``set_epoch`` or ``len()`` share the training process's copy (copy on
        write) instead of each computing it (0.08 s and 20 MB at 1,000,000 shards). Under
        node affinity it depends on ``world_size`` too (:meth:`node_layout`)."""
        assert self.counts is not None  # internal invariant: callers check
        orders = self._orders
        layout = self.node_layout(world_size)
        key = (epoch, layout)
        if key not in orders:
            starts = next(iter(orders.values())).starts if orders else None
            orders[key] = ShardOrder.make(
                self.counts, seed=self.seed, epoch=epoch, shuffle=self.shuffle, starts=starts, nodes=layout
            )
            while len(orders) > 2:
                del orders[next(iter(orders))]
        return orders[key]

    def prepare(self, epoch: int, slot: WorkerSlot | None = None) -> None:
        self.shard_order(epoch, slot.world_size if slot is not None else None)

    def plan(self, state: PassState, slot: WorkerSlot | None = None) -> EpochPlan:
        """The plan of the pass ``state``: its epoch, resumed from its checkpoint segments."""
        assert self.counts is not None  # internal invariant: callers check
        world_size = slot.world_size if slot is not None else None
        if slot is not None and (layout := self.node_layout(world_size)) is not None:  # node affinity
            _say_repartitioned(state.epoch, segments_of(state), slot.world_size)
            _check_node(slot.rank, layout.ranks_per_node)
        order = self.shard_order(state.epoch, world_size)
        orders = functools.partial(self.shard_order, state.epoch) if self.shard_affinity is not None else None
        return EpochPlan(shard_order=order, orders=orders, counts=self.counts, **self._plan_args(state))

    def read_worker(
        self, mine: WorkerPlan, epoch: int, engines: Sequence[ReadingEngine], **read: Any
    ) -> Iterator[Batch | FileRun]:
        return engines[0].read_plan(mine, **read)

    def loaded_state(self, state: dict[str, Any]) -> PassState:
        """The pass a checkpoint resumes, once checked against these shards and settings.

        Raises:
            ValueError: the state is not a shardstream state, or was saved for another
                dataset or with other shuffle settings (each named).
        """
        epoch, segments = self._checked(
            state, {"num_samples": self.num_samples, "num_shards": self.num_shards}, "for another dataset or settings"
        )
        return PassState(epoch, segments)


@functools.lru_cache(maxsize=16)
def _say_repartitioned(epoch: int, segments: tuple[Segment, ...], world_size: int) -> None:
    """Under node affinity, a resume at another world size: say once what happens to the
    nodes' shares."""
    if segments and segments[-1].world_size != world_size:
        log.warning(
            "shard_affinity='node': epoch %d was checkpointed with world_size=%d and resumes with %d: the "
            "rest of this epoch is split over the new ranks without regard to nodes, and from the next epoch "
            "on each node gets a new fixed share of the shards (node caches fill once more)",
            epoch,
            segments[-1].world_size,
            world_size,
        )


@functools.lru_cache(maxsize=4)
def _check_node(rank: int, ranks_per_node: int) -> None:
    """Under node affinity, warn once when torchrun's node number (``GROUP_RANK``, or
    ``NODE_RANK``) is not ``rank // ranks_per_node``, the node the shares assume: then nodes
    read each other's shares (still exact, but their caches miss)."""
    raw = torchrun_env().node_rank
    if raw is None or not raw.strip().isdigit() or int(raw) == rank // ranks_per_node:
        return
    log.warning(
        "shard_affinity='node': this is rank %d with %d ranks per node, so node %d by the shares, but "
        "GROUP_RANK/NODE_RANK says node %s: ranks are not numbered node by node here; epochs stay exact, "
        "but node caches miss. Give NodeAffinity(ranks_per_node=...) the ranks each node runs.",
        rank,
        ranks_per_node,
        rank // ranks_per_node,
        raw,
    )


def segments_of(state: PassState) -> tuple[Segment, ...]:
    """The checkpoint segments a pass resumes (none when unknown here: a worker's own state)."""
    return tuple(Segment.from_dict(x) for x in state.segments or ())
