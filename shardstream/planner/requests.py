"""What each epoch sends to the store: requests and bytes, run by run.

Requests (the count rule)
-------------------------
What the reader sends to a remote store, per epoch; retries are not counted:

1. **index**: one GET of ``index.bin`` per rank and source, when the dataset is opened
   (DataLoader workers map the rank's copy): counted in the first epoch.
2. **tables**: one GET of ``NAME.samples`` per run per reading process, unless the process
   still holds it (each DataLoader worker, and each source of a mixture, keeps an LRU of
   :data:`~shardstream.index.resolve.TABLES_KEPT` (64) tables: a fresh process holds none, so
   a shard met twice by it within 64 runs is fetched once; with ``persistent_workers``, or
   ``workers=0``, the LRU lives on from epoch to epoch and is simulated over the runs in the
   order the lanes reach them). With a node cache, a table the process does not hold is
   looked up in the node cache first (tables are cache entries too, of their own size: a hit
   sends no GET; a miss is fetched and written in).
3. **data**: ranged GETs of the lane's ``part_bytes`` (``p``) over the run's byte range
   ``L`` bytes long: ``ceil(L / p)``; the first run of each lane ramps (its GETs start at
   ``p / 64`` and double up to ``p``: :func:`~shardstream.storage.producer.part_ranges`).
   With a node cache: a hit sends none; a miss fills the whole shard (GETs from the run's
   first byte to the end, the first run of a lane ramping, then from 0 to that byte), and
   its egress is the whole shard; a fill that bypasses the cache (a shard larger than it, or
   no unpinned room: :mod:`.cache`) reads its range only.
4. No HEADs: the index gives every shard's size (a store whose answers name no version,
   such as the GCS emulator, would add two HEADs a read: not modelled).

For a local dataset the same counts are what it would cost in a remote store (read locally,
files are read in place: no requests, no cache).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..index.resolve import TABLES_KEPT
from ..storage.producer import part_ranges
from .opening import Data
from .runs import Epoch, Fetches, Ranges, epoch_runs, lane_progress
from .settings import PlanSettings

__all__ = ["EpochReads", "Traffic", "epoch_reads", "gets", "ramp_sizes", "table_gets", "traffic"]


def ramp_sizes(part: int) -> list[int]:
    """The sizes of a ramping read's GETs before they reach ``part`` bytes (``part / 64``,
    doubling), as :func:`~shardstream.storage.producer.part_ranges` cuts them: three parts'
    bytes hold the ramp (under two parts) and one whole part."""
    sizes = (end - start for start, end in part_ranges(0, 3 * part, part, ramp=True))
    return list(itertools.takewhile(lambda size: size < part, sizes))


def gets(length: np.ndarray, part: np.ndarray, ramp: np.ndarray) -> np.ndarray:
    """Ranged GETs reading ``length`` bytes in parts of ``part`` (arrays, one entry per read),
    ramping (``ramp``: from ``part / 64``, doubling) as
    :func:`~shardstream.storage.producer.part_ranges` cuts them."""
    length = np.asarray(length, np.int64)
    part = np.broadcast_to(np.asarray(part, np.int64), length.shape)
    ramp = np.broadcast_to(np.asarray(ramp, bool), length.shape)
    out = -(-length // part)
    for p in np.unique(part[ramp]).tolist():
        sizes = ramp_sizes(p)
        if not sizes:
            continue
        cum = np.cumsum(sizes)
        sel = ramp & (part == p)
        n = length[sel]
        small = np.searchsorted(cum, n, side="left") + 1
        big = len(sizes) + -(-(n - cum[-1]) // p)
        out[sel] = np.where(n <= 0, 0, np.where(n <= cum[-1], small, big))
    return np.maximum(out, 0)


def table_gets(ep: Epoch, t: np.ndarray, kept: dict[int, collections.OrderedDict] | None) -> np.ndarray:
    """1 where a run's table is fetched, 0 where its process still holds it (module doc, rule
    2). ``kept``: each reader's LRU of tables, carried from epoch to epoch (persistent workers),
    simulated over its runs in the order its lanes reach them (``t``); None: a fresh process
    each epoch, where only a shard met again within 64 runs is not fetched again."""
    n = len(ep.shard)
    fetched = np.ones(n, np.int64)
    if n == 0:
        return fetched
    if kept is None:
        perm = np.lexsort((ep.idx, ep.shard, ep.reader))  # by reader, shard, place
        r, s, i = ep.reader[perm], ep.shard[perm], ep.idx[perm]
        again = np.concatenate([[False], (r[1:] == r[:-1]) & (s[1:] == s[:-1]) & (i[1:] - i[:-1] < TABLES_KEPT)])
        fetched[perm[again]] = 0
        return fetched
    perm = np.lexsort((ep.idx, t, ep.reader))  # by reader, then as its lanes reach them
    out = [1] * n
    current, lru = -1, collections.OrderedDict()
    for j, reader, shard in zip(perm.tolist(), ep.reader[perm].tolist(), ep.shard[perm].tolist()):
        if reader != current:
            current = reader
            lru = kept.setdefault(reader, collections.OrderedDict())
        if shard in lru:
            lru.move_to_end(shard)
            out[j] = 0
        else:
            lru[shard] = None
            if len(lru) > TABLES_KEPT:
                lru.popitem(last=False)
    return np.asarray(out, np.int64)


@dataclass
class EpochReads:
    """One epoch's runs (arrays, one entry per run) and what each would cost read from the
    store, as a node-cache hit, or as a fill (module doc)."""

    ep: Epoch
    count: np.ndarray  # samples
    node: np.ndarray  # the node reading it
    t: np.ndarray  # its start, as its lane's share read before it (runs.lane_progress)
    read_bytes: np.ndarray  # its byte range's length
    read_gets: np.ndarray  # GETs reading its byte range
    fill_gets: np.ndarray  # GETs filling the node cache with its whole shard
    size: np.ndarray  # its shard's bytes
    table_runs: np.ndarray  # the runs whose table the process does not hold (indices)
    table_size: np.ndarray  # its table's bytes
    held: dict[str, Any] | None = None  # the node caches' bytes at the epoch's end (cache.simulate_cache)


def epoch_reads(data: Data, s: PlanSettings, schedule: Any, fetches: Fetches, ranges: Ranges) -> list[EpochReads]:
    """Each epoch's runs and their costs (module doc); the processes' tables carried from
    epoch to epoch where they persist."""
    per_epoch = []
    kept_tables: dict[int, collections.OrderedDict] | None = {} if s.persistent else None
    for e in range(s.epochs):
        ep = epoch_runs(data, s, schedule, e, fetches)
        count = ep.hi - ep.lo + 1
        first, last = ranges.of(ep)
        part = ep.r_part[ep.reader]
        ramp = ep.idx < ep.r_lanes[ep.reader]
        size = data.nbytes[ep.shard]
        progress = lane_progress(ep, count)
        per_epoch.append(
            EpochReads(
                ep=ep,
                count=count,
                node=ep.r_node[ep.reader],
                t=progress,
                read_bytes=last - first,
                read_gets=gets(last - first, part, ramp),
                fill_gets=gets(size - first, part, ramp) + gets(first, part, np.zeros(len(first), bool)),
                size=size,
                table_runs=np.flatnonzero(table_gets(ep, progress, kept_tables)),
                table_size=data.table_bytes[ep.shard],
            )
        )
    return per_epoch


@dataclass
class Traffic:
    """What one epoch sends to the store, given the node caches' outcomes.

    Attributes:
        moved: bytes each run reads from the store (its range, its whole shard for a fill,
            none for a hit).
        hit: the runs served by the node cache.
        egress_detail: bytes of shards (``data``), sample tables and index.bin.
        requests_detail: GETs of the index, tables and data.
        hit_rate: hits / accesses of the node caches (0 without a cache).
    """

    moved: np.ndarray
    hit: np.ndarray
    egress_detail: dict[str, int]
    requests_detail: dict[str, int]
    hit_rate: float


def traffic(x: EpochReads, got: np.ndarray, first: bool, data: Data, s: PlanSettings) -> Traffic:
    """Epoch ``x``'s requests and bytes (module doc) where its accesses came out as ``got``
    (its table accesses, then its shards': 0 hit, 1 fill, 2 read past the cache); ``first``:
    the first epoch, which opens the index."""
    asked = len(x.table_runs)
    table_got, got = got[:asked], got[asked:]  # the table accesses, then the shards'
    hit, fill = got == 0, got == 1
    moved = np.where(fill, x.size, np.where(hit, 0, x.read_bytes))
    data_gets = np.where(fill, x.fill_gets, np.where(hit, 0, x.read_gets))
    table_fetched = x.table_runs[table_got != 0]
    return Traffic(
        moved=moved,
        hit=hit,
        egress_detail={
            "data": int(moved.sum()),
            "tables": int(x.table_size[table_fetched].sum()),
            "index": s.world_size * sum(data.index_bytes) if first else 0,
        },
        requests_detail={
            "index": s.world_size * data.num_sources if first else 0,
            "tables": len(table_fetched),
            "data": int(data_gets.sum()),
        },
        hit_rate=float(hit.mean()) if s.cache_bytes and len(hit) else 0.0,
    )
