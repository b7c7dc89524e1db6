"""The node cache, simulated: what each access of each epoch finds (a hit, a fill, or a read
past the cache), and the cache at which epochs after the first read nothing from the store.

The node cache (the policy of :mod:`shardstream.storage.cache`)
---------------------------------------------------------------
One cache per node, shared by its ranks and workers, holding whole shards (and the sample
tables of remote shards, each of its own size), bounded in bytes
(``cache_bytes``), least recently used evicted first when a fill needs room; a shard larger
than the bound is never cached. Each node's accesses (one per run) are simulated in time
order, across epochs: a run starts when its lane has read the runs before it (lanes progress
at one pace: a run's start is the share of its lane's samples read before it). An entry a
lane reads (a hit, or a fill) is pinned from its run's start until the lane's next run
starts, and eviction skips pinned entries: a fill evicts unpinned entries, least recently
used first, until it fits; where even then it does not (the pinned ones fill the cache) it
bypasses: its run's byte range is read from the store, nothing is cached. Not modelled: a
fill another process waits for (up to ``cache_wait_s``), and the order in which lanes that
start together reach the cache (simulated rank by rank, worker by worker), which decides
which of them bypass, run to run, in a cache smaller than the shards held open.
``cache_hit_rate`` is hits / accesses, as ``stats()`` counts ``cache_hits`` and
``cache_misses``.
"""

from __future__ import annotations

import collections
import heapq

import numpy as np

from .opening import Data
from .requests import EpochReads
from .settings import PlanSettings

__all__ = ["min_cache", "simulate_cache"]

_KEYS = ("node", "t", "sub", "reader", "key", "size", "epoch", "until")


def simulate_cache(per_epoch: list[EpochReads], nodes: int, cap: int, num_shards: int) -> list[np.ndarray]:
    """The outcome of each access per epoch (0 hit, 1 fill, 2 read past the cache): each
    node's LRU cache of ``cap`` bytes over its accesses in time order (module doc). An epoch's
    accesses are its table accesses (``x.table_runs``: runs whose table the process does
    not hold, key ``num_shards + shard``) then its runs' shard accesses; a run's table is
    asked for just before its shard. Records the bytes each node holds at the end of each
    epoch in ``per_epoch[e].held``."""
    each = [_accesses(x, e, num_shards) for e, x in enumerate(per_epoch)]
    lengths = [len(p["key"]) for p in each]
    if not cap:
        for x in per_epoch:
            x.held = {"held_mean": 0.0, "held_max": 0}
        return [np.full(n, 2, np.int8) for n in lengths]
    epochs = len(per_epoch)
    node, t, sub, reader, key, size, epoch_of, until = (np.concatenate([p[k] for p in each]) for k in _KEYS)
    order = np.lexsort((sub, reader, t, node))  # by node, then time; a run's table before its shard
    out = np.full(len(key), 2, np.int8)
    held = np.zeros((epochs, nodes), np.int64)
    node_key = node * (2 * num_shards) + key
    _, first_at = np.unique(node_key[order], return_index=True)
    union = np.bincount(node[order][first_at], weights=size[order][first_at], minlength=nodes)
    if union.max() <= cap:  # nothing is ever evicted: a hit is any access after a node's first
        first = np.zeros(len(order), bool)
        first[first_at] = True
        out[order] = np.where(first, 1, 0)
        for e in range(epochs):
            seen = order[first & (epoch_of[order] <= e)]
            held[e] = np.bincount(node[seen], weights=size[seen], minlength=nodes)
    else:
        columns = (key, size, node, epoch_of, t, until)
        out[order] = np.asarray(_lru(*(c[order].tolist() for c in columns), cap=cap, held=held), np.int8)
    outcomes = []
    at = 0
    for e, (x, n) in enumerate(zip(per_epoch, lengths)):
        outcomes.append(out[at : at + n])
        x.held = {"held_mean": float(held[e].mean()), "held_max": int(held[e].max())}
        at += n
    return outcomes


def _accesses(x: EpochReads, e: int, num_shards: int) -> dict[str, np.ndarray]:
    """Epoch ``e``'s accesses of the node caches (its tables', then its shards'), as arrays of
    :data:`_KEYS`: time ``t`` and ``until`` (the end of its pin) in epochs from the first."""
    ep, runs = x.ep, x.table_runs
    # a shard's entry is pinned while its lane reads the run: until the lane's next run starts
    lanes = ep.r_lanes[ep.reader]
    lane = ep.reader * (int(ep.r_lanes.max()) if len(ep.r_lanes) else 1) + ep.idx % lanes
    perm = np.lexsort((ep.idx, lane))
    until = np.ones(len(ep.shard))
    same = lane[perm][1:] == lane[perm][:-1]
    until[perm[:-1][same]] = x.t[perm[1:][same]]
    return {
        "node": np.concatenate([x.node[runs], x.node]),
        "t": np.concatenate([x.t[runs], x.t]) + e,
        "until": np.concatenate([x.t[runs], until]) + e,
        "sub": np.concatenate([np.zeros(len(runs), np.int8), np.ones(len(ep.shard), np.int8)]),
        "reader": np.concatenate([ep.reader[runs], ep.reader]),
        "key": np.concatenate([ep.shard[runs] + num_shards, ep.shard]),
        "size": np.concatenate([x.table_size[runs], x.size]),
        "epoch": np.full(len(runs) + len(ep.shard), e, np.int64),
    }


def _lru(
    k_list: list[int],
    z_list: list[int],
    n_list: list[int],
    e_list: list[int],
    t_list: list[float],
    u_list: list[float],
    *,
    cap: int,
    held: np.ndarray,
) -> list[int]:
    """Each access's outcome (0 hit, 1 fill, 2 read past the cache), the accesses given by
    node, then time (their entries' keys and bytes, nodes, epochs, starts and pins' ends), in
    caches of ``cap`` bytes that evict (module doc); the bytes each node holds at the end of
    each epoch go to ``held`` (epochs x nodes)."""
    result = [2] * len(k_list)
    cache: collections.OrderedDict[int, int] = collections.OrderedDict()
    pins: dict[int, int] = {}  # entries being read (pinned: never evicted)
    ending: list[tuple[float, int]] = []  # (when its read ends, entry)
    current, used, cur_epoch = -1, 0, 0
    for j, (k, z, n, e, now, end) in enumerate(zip(k_list, z_list, n_list, e_list, t_list, u_list)):
        if n != current:
            if current >= 0:
                held[cur_epoch:, current] = used
            current, used, cur_epoch = n, 0, e
            cache.clear()
            pins.clear()
            ending.clear()
        if e != cur_epoch:
            held[cur_epoch:e, n] = used
            cur_epoch = e
        while ending and ending[0][0] <= now:
            pins[heapq.heappop(ending)[1]] -= 1
        if k in cache:
            cache.move_to_end(k)  # most recently used last
            result[j] = 0
        elif z > cap:
            result[j] = 2
            continue
        else:
            freed, victims = 0, []
            for old, old_z in cache.items():  # least recently used first, the pinned skipped
                if used - freed + z <= cap:
                    break
                if not pins.get(old):
                    victims.append(old)
                    freed += old_z
            for old in victims:
                del cache[old]
            used -= freed
            if used + z > cap:  # no unpinned room: the fill bypasses the cache
                result[j] = 2
                continue
            cache[k] = z
            used += z
            result[j] = 1
        if end > now:
            pins[k] = pins.get(k, 0) + 1
            heapq.heappush(ending, (end, k))
    if current >= 0:
        held[cur_epoch:, current] = used
    return result


def min_cache(data: Data, per_epoch: list[EpochReads], s: PlanSettings) -> tuple[int, str]:
    """The node cache at which epochs after the first read nothing from the store, and what
    that means here."""
    nodes = s.nodes
    varies = data.sources is not None and any(
        src.samples is not None or src.weight is not None or (src.repeat or 1.0) % 1 for src in data.sources
    )
    if (s.shard_affinity == "node" or nodes == 1) and not varies:
        x = per_epoch[0]  # the shards each node reads (the same every epoch)
        uniq = _unique(x.node * len(data.counts) + x.ep.shard)
        shards = uniq % len(data.counts)
        per_node = np.bincount(uniq // len(data.counts), weights=data.nbytes[shards], minlength=nodes)
        need = int(per_node.max()) if len(per_node) else 0
    if s.shard_affinity == "node" and not varies:
        return need, (
            "node affinity: the largest node's share, whole shards (each node reads the same shards every epoch)"
        )
    total = int(data.nbytes.sum())
    if nodes == 1 and not varies:
        return need, "one node: every shard the job reads, whole"
    return total, (
        "the whole dataset: without node affinity each epoch gives a node other shards, so even a cache of the "
        "whole dataset misses until every shard has been read once on that node; use shard_affinity='node'"
        if nodes > 1
        else "the whole dataset: a mixture read in part reads other shards each epoch"
    )


def _unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by a sort (numpy 2.4's hashing unique is ~100x slower on 10^6 int64)."""
    s = np.sort(values)
    return s[np.concatenate([[True], s[1:] != s[:-1]])] if len(s) else s
