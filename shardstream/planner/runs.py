"""Each epoch's runs: what every rank's every DataLoader worker reads, from the reader's own
plan, and the bytes of each run.

What it is built on
-------------------
The assignment is the reader's own: each epoch's plan comes from the schedule
:func:`~shardstream.reading.mixschedule.schedule_for` picks (one dataset:
:class:`~shardstream.reading.schedule.EpochSchedule`; a mixture:
:class:`~shardstream.reading.mixschedule.MixtureSchedule`, with
the same ``epoch_counts`` and selections), and for every rank and DataLoader worker
:meth:`~shardstream.reading.plan.EpochPlan.piece_runs` gives the runs that worker reads
(``PlanRun(shard, lo, hi)``), O(shards met) per worker. With ``shard_affinity="node"`` the
order is the node-affine one (``NodeLayout``), whose pieces may be parts of shards. A worker's
runs are dealt round-robin to its lanes (``max_open_shards``, fewer when it has fewer runs;
one without shuffle), as :meth:`~shardstream.reading.plan.EpochPlan.worker_plan` deals them.
Each lane's read-ahead settings are cut from :class:`~shardstream.config.FetchConfig` by the
reader's own cuts, in the order the reader makes them (the rank's workers:
:func:`~shardstream.reading.engine.share_buffer`; a mixture's sources:
:func:`~shardstream.reading.engine.source_fetch`; the worker's lanes:
:func:`~shardstream.reading.engine.lane_fetch`), so the planner's ``part_bytes`` is the one
each lane's ranged GETs really use.

Bytes of a run
--------------
A run covering a whole shard reads the whole file (``Manifest.shard_bytes``): exact. A run
cut from a shard (at a rank, worker or node boundary) reads a byte range; its bytes are the
shard's bytes x ``run.count / shard samples`` (proportional), or, where the planner read the
cut shards' sample tables (``JobPlan.byte_ranges == "exact"``: a dataset given by location,
few cut shards), exactly the range the reader asks for (``sample_ends``).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from ..config import FetchConfig
from ..reading.assign import NodeAffinity, WorkerSlot
from ..reading.engine import lane_fetch, share_buffer, source_fetch
from ..reading.epochs import PassState
from ..reading.mixschedule import schedule_for
from ..reading.schedule import Schedule
from .opening import Counts, Data
from .settings import PlanSettings

__all__ = ["Epoch", "Fetches", "Ranges", "epoch_runs", "epoch_total", "exact_ranges", "lane_progress", "schedule_of"]

_EXACT_CUTS_LOCAL = 4096  # cut shards whose tables the planner reads for exact byte ranges
_EXACT_CUTS_REMOTE = 256


@dataclass
class Epoch:
    """One epoch's runs, as arrays (one entry per run), and its readers."""

    shard: np.ndarray  # global shard id
    lo: np.ndarray
    hi: np.ndarray
    reader: np.ndarray  # the reader (rank, worker, source) reading it
    idx: np.ndarray  # its place among its reader's runs
    r_node: np.ndarray  # per reader
    r_proc: np.ndarray  # per reader: rank * workers + worker
    r_lanes: np.ndarray
    r_part: np.ndarray  # per reader: its lanes' part_bytes
    r_inflight: np.ndarray  # per reader: GETs in flight at most (all lanes)


def schedule_of(data: Data, s: PlanSettings) -> Schedule:
    """The reader's schedule of ``data`` for the job ``s`` (module doc)."""
    sets = [Counts(data.counts[data.source_starts[i] : data.source_starts[i + 1]]) for i in range(data.num_sources)]
    affinity = NodeAffinity(s.gpus_per_node) if s.shard_affinity == "node" else None
    return schedule_for(
        data.sources, sets, s.order, epoch_samples=data.epoch_samples, mix=data.mix, shard_affinity=affinity
    )


def epoch_total(data: Data, schedule: Any) -> int:
    """Samples of one epoch: the dataset's, or the mixture's (its sources' counts)."""
    if data.sources is None:
        return int(data.counts.sum())
    return int(sum(schedule.per_epoch))


class Fetches:
    """Each reader's lanes' FetchConfig, cut as the reader cuts it (module doc), kept per shape."""

    def __init__(self, fetch: FetchConfig, workers: int) -> None:
        self.worker = share_buffer(fetch, workers)
        self.kept: dict[tuple[float | None, int], tuple[int, int]] = {}

    def lanes(self, share: float | None, lanes: int) -> tuple[int, int]:
        """(part_bytes, GETs in flight at most) of a reader with ``lanes`` lanes (``share`` of
        the worker's samples: a mixture source's; None: the worker's own)."""
        key = (share, lanes)
        if key not in self.kept:
            fetch = self.worker if share is None else source_fetch(self.worker, share)
            fetch = lane_fetch(fetch, lanes)
            per_lane = min(fetch.max_inflight_requests, max(1, fetch.max_buffer_bytes // fetch.part_bytes))
            self.kept[key] = (fetch.part_bytes, per_lane * lanes)
        return self.kept[key]

    def shards_per_lane(self, lanes: int) -> int:
        """Shards in flight at most on each of a worker's ``lanes`` lanes (its
        ``max_inflight_shards`` as the reader cuts it)."""
        return lane_fetch(self.worker, lanes).max_inflight_shards


def exact_ranges(data: Data, s: PlanSettings) -> bool:
    """Whether the byte ranges of cut shards are read from their sample tables (few enough
    readers of a dataset given by location) rather than taken in proportion."""
    cut_limit = _EXACT_CUTS_LOCAL if data.store == "local" else _EXACT_CUTS_REMOTE
    return data.indexes is not None and s.epochs * s.world_size * s.processes * data.num_sources <= cut_limit


def _readers(the_plan: Any, schedule: Any, data: Data, s: PlanSettings, epoch: int, rank: int, w: int) -> list[Any]:
    """The readers of worker ``w`` of ``rank``: ``(runs, lanes, share, first shard)``, one, or
    one a source of a mixture (its ``share`` of the worker's samples)."""
    world, workers = s.world_size, s.processes
    if data.sources is None:
        mine = the_plan.piece_runs(
            None, world_size=world, rank=rank, num_workers=workers, worker_id=w, batch_size=s.batch_size
        )
        lanes = the_plan.worker_plan(mine, seg=0, rank=rank, worker_id=w).lanes
        return [(mine, lanes, None, 0)]
    mwp = the_plan.worker_plan(
        None, seg=0, world_size=world, rank=rank, num_workers=workers, worker_id=w, batch_size=s.batch_size
    )
    reals = schedule.real_plans(mwp, epoch)
    total = max(1, sum(p.count for p in reals))
    return [(p.runs, p.lanes, p.count / total, data.source_starts[i]) for i, p in enumerate(reals)]


def epoch_runs(data: Data, s: PlanSettings, schedule: Any, epoch: int, fetches: Fetches) -> Epoch:
    """Every worker's runs of ``epoch`` from the reader's own plan (module doc)."""
    world, workers = s.world_size, s.processes
    slot = WorkerSlot(rank=0, world_size=world, worker_id=0, num_workers=workers)
    mixture = data.sources is not None
    the_plan = schedule.plan(PassState(epoch, []), slot) if not mixture else schedule.plan(PassState(epoch, []))
    runs: list[Any] = []
    lengths, shard_base = [], []
    r_node, r_proc, r_lanes, r_part, r_inflight = [], [], [], [], []
    for rank in range(world):
        for w in range(workers):
            for mine, lanes, share, base in _readers(the_plan, schedule, data, s, epoch, rank, w):
                part, inflight = fetches.lanes(share, lanes)
                runs += mine
                lengths.append(len(mine))
                shard_base.append(base)
                r_node.append(rank // s.gpus_per_node)
                r_proc.append(rank * workers + w)
                r_lanes.append(lanes)
                r_part.append(part)
                r_inflight.append(inflight)
    n = len(runs)
    lengths_a = np.asarray(lengths, np.int64)
    reader = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths_a)
    starts = np.concatenate([[0], np.cumsum(lengths_a)])
    shard = np.fromiter(map(itemgetter(0), runs), np.int64, count=n) + np.asarray(shard_base, np.int64)[reader]
    return Epoch(
        shard=shard,
        lo=np.fromiter(map(itemgetter(1), runs), np.int64, count=n),
        hi=np.fromiter(map(itemgetter(2), runs), np.int64, count=n),
        reader=reader,
        idx=np.arange(n, dtype=np.int64) - starts[reader],
        r_node=np.asarray(r_node, np.int64),
        r_proc=np.asarray(r_proc, np.int64),
        r_lanes=np.asarray(r_lanes, np.int64),
        r_part=np.asarray(r_part, np.int64),
        r_inflight=np.asarray(r_inflight, np.int64),
    )


def lane_progress(ep: Epoch, counts: np.ndarray) -> np.ndarray:
    """Each run's start as the share of its lane's samples read before it (lanes progress at
    one pace), in [0, 1)."""
    lanes = ep.r_lanes[ep.reader]
    key = ep.reader * (int(ep.r_lanes.max()) if len(ep.r_lanes) else 1) + ep.idx % lanes
    perm = np.argsort(key, kind="stable")
    k = key[perm]
    c = counts[perm].astype(np.float64)
    cs = np.cumsum(c)
    first = np.concatenate([[True], k[1:] != k[:-1]]) if len(k) else np.zeros(0, bool)
    group = np.cumsum(first) - 1
    base = (cs - c)[first]
    totals = np.diff(np.concatenate([base, [cs[-1] if len(cs) else 0.0]]))
    before = cs - c - base[group]
    out = np.empty(len(k))
    out[perm] = before / np.maximum(totals[group], 1.0)
    return out


class Ranges:
    """Byte ranges of runs: whole shards exactly, cut ones from their sample tables when read
    (exact) or in proportion to their samples (module doc, "Bytes of a run")."""

    def __init__(self, data: Data, exact: bool) -> None:
        self.data, self.exact, self.ends = data, exact, {}

    def of(self, ep: Epoch) -> tuple[np.ndarray, np.ndarray]:
        """The first byte and the end (exclusive) of each run of ``ep`` in its shard."""
        counts, nbytes = self.data.counts[ep.shard], self.data.nbytes[ep.shard]
        whole = (ep.lo == 0) & (ep.hi == counts - 1)
        first = np.where(whole, 0, nbytes * ep.lo // np.maximum(counts, 1))
        last = np.where(whole, nbytes, nbytes * (ep.hi + 1) // np.maximum(counts, 1))
        if self.exact:
            for i in np.flatnonzero(~whole).tolist():
                ends = self._ends(int(ep.shard[i]))
                lo, hi = int(ep.lo[i]), int(ep.hi[i])
                first[i], last[i] = (int(ends[lo - 1]) if lo else 0), int(ends[hi])
        return first, last

    def _ends(self, shard: int) -> np.ndarray:
        if shard not in self.ends:
            s = int(np.searchsorted(self.data.source_starts, shard, side="right")) - 1
            index = self.data.indexes[s]  # type: ignore[index]
            self.ends[shard] = index.table(shard - self.data.source_starts[s]).sample_ends()
        return self.ends[shard]
