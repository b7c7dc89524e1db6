"""What the plan advises and warns of: workers, read-ahead, shard size and cache size for the job
(``JobPlan.recommendations``, each with its reason), the warnings of a job too wide for its data,
and the notes on what the figures assume."""

from __future__ import annotations

import math
from typing import Any

from ..config import FetchConfig
from ..reading.plan import per_rank as rank_share
from .figures import Figures
from .opening import Data
from .report import JobPlan, duration, rate, size
from .settings import PlanSettings

__all__ = ["batch_warnings", "notes", "recommend"]


def recommend(job: JobPlan, data: Data, s: PlanSettings, f: Figures) -> list[dict[str, Any]]:
    """Workers, read-ahead, shard size and cache size for this job, each a ``{"setting",
    "value", "reason"}`` dict."""
    pace = s.pace
    per_sample = job.dataset["bytes_per_sample"]
    # workers: enough CPU for the pace (or for the node's bandwidth without one), 25% spare
    want = pace if pace else min(f.bandwidth_per_node / per_sample / s.gpus_per_node, 1e9)
    need_workers = max(1, math.ceil(want * f.cpu_s_per_sample * 1.25))
    out = [
        {
            "setting": "workers",
            "value": need_workers,
            "reason": f"{want:,.0f} samples/s per rank at {duration(f.cpu_s_per_sample)} of reader CPU a sample, "
            f"25% spare ({'the consumer pace' if pace else 'what the node link can bring'}); needs that many free "
            f"cores per GPU ({need_workers * s.gpus_per_node:,} per node)",
        }
    ]
    out += _read_ahead(job, s, f, per_sample)
    out.append(_shard_size(job, s))
    out += _cache_size(job, data, s)
    return out


def _read_ahead(job: JobPlan, s: PlanSettings, f: Figures, per_sample: float) -> list[dict[str, Any]]:
    """FetchConfig's GETs in flight, buffer, shards in flight and, near the store's request
    rate limit, part size."""
    fetch, gpn, workers = s.fetch, s.gpus_per_node, s.processes
    lat, bw_stream = f.latency_s, f.bandwidth_per_stream
    # GETs in flight per worker for its share of the node link at this latency
    lanes = _lanes(s)
    part = fetch.part_bytes
    per_worker = min(f.bandwidth_per_node, (s.pace or math.inf) * gpn * per_sample) / (gpn * workers)
    in_flight = max(1, math.ceil(per_worker * (lat + part / bw_stream) / part))
    in_flight = max(in_flight, lanes)
    buffer = 2 * part * workers * max(lanes, in_flight)
    out = [
        {
            "setting": "FetchConfig.max_inflight_requests",
            "value": max(fetch.max_inflight_requests, in_flight),
            "reason": f"{rate(per_worker)} per worker at {duration(lat)} latency and "
            f"{rate(bw_stream)} a stream needs {in_flight:,} GETs of {size(part)} in flight",
        },
        {
            "setting": "FetchConfig.max_buffer_bytes",
            "value": max(fetch.max_buffer_bytes, buffer),
            "reason": f"a rank's {workers} workers x {max(lanes, in_flight)} parts x 2 keep part_bytes={size(part)} "
            "whole per lane (share_read_ahead halves a smaller share down to 1 MiB GETs)",
        },
        {
            "setting": "FetchConfig.max_inflight_shards",
            "value": max(fetch.max_inflight_shards, lanes + 1),
            "reason": f"one more than the {lanes} lanes a worker reads at once (max_open_shards), so the next "
            "shard's GETs start before a lane's shard ends",
        },
    ]
    return out + _part_size(job, fetch)


def _lanes(s: PlanSettings) -> int:
    """Lanes a worker reads at once: ``max_open_shards``, one without shuffle."""
    return s.order.max_open_shards if s.order.shuffle else 1


def _part_size(job: JobPlan, fetch: FetchConfig) -> list[dict[str, Any]]:
    """A larger ``part_bytes`` where the last epoch's GETs would be over 80% of the store's
    request rate limit."""
    egress_rate = job.egress_bytes_per_epoch[-1] / max(job.epoch_time_s[-1], 1e-12)
    limit = job.figures["request_rate_limit"]["value"]
    part = fetch.part_bytes
    if not limit:
        return []
    want_part = egress_rate / (0.8 * limit)
    if want_part <= part:
        return []
    return [
        {
            "setting": "FetchConfig.part_bytes",
            "value": 1 << math.ceil(math.log2(want_part)),
            "reason": f"{rate(egress_rate)} in GETs of {size(part)} is over 80% of the store's {limit:,.0f} GETs/s",
        }
    ]


def _shard_size(job: JobPlan, s: PlanSettings) -> dict[str, Any]:
    """The shard size: big enough that a shard is many GETs' worth (tables, ramps and cuts are
    small), small enough that every worker has several shards per lane each epoch."""
    world, workers, lanes, part = job.world_size, s.processes, _lanes(s), s.fetch.part_bytes
    total = job.dataset["bytes"]
    small = 4 * part
    large = total / max(1, world * workers * 4 * lanes)
    mean = job.dataset["mean_shard_bytes"]
    if large >= small:
        value = f"{size(small)} - {size(large)}"
        fine = small <= mean <= large
        reason = (
            f"now {size(mean)}: "
            + ("within" if fine else "outside")
            + f" the range: >= 4 x part_bytes ({size(part)}) per shard keeps tables and ramps small; <= dataset "
            f"/ ({world:,} ranks x {workers} workers x 4 shards x {lanes} lanes) gives each lane several shards"
        )
    else:
        value = size(small)
        reason = (
            f"now {size(mean)}: the dataset is too small for every worker's lanes to get several shards of "
            f">= 4 x part_bytes; prefer fewer, larger GETs (shards of {size(small)}) or fewer workers"
        )
    return {"setting": "shard size (pack --shard-size)", "value": value, "reason": reason}


def _cache_size(job: JobPlan, data: Data, s: PlanSettings) -> list[dict[str, Any]]:
    """A node cache of ``min_cache_bytes_per_node`` where the one planned is smaller."""
    need = job.min_cache_bytes_per_node
    if s.cache_bytes >= need:
        return []
    reason = (
        f"a cache of {size(need)} per node reads nothing from the store after the first epoch"
        if s.shard_affinity == "node" or (s.nodes == 1 and data.sources is None)
        else f"{job.min_cache_note}"
    )
    if s.shard_affinity is None and s.nodes > 1:
        reason += (
            f"; with shard_affinity='node' a node needs only its share, "
            f"~{size(job.dataset['bytes'] / s.nodes)}, to read nothing after the first epoch"
        )
    return [{"setting": "cache_bytes (per node)", "value": need, "reason": reason}]


def batch_warnings(total: int, world: int, batch: int, *, drop_last: bool, mixture: bool) -> list[str]:
    """Warnings for a job too wide for its data: ``total`` samples an epoch under one global
    batch (``world x batch``), and a rank's share of an epoch under one batch, with what that
    does under ``drop_last`` (``ShardDataset``'s: floor or ceil of ``total / world`` per rank)
    and what to do."""
    out = []
    what = "a mixture epoch's" if mixture else "the dataset's"
    if total < world * batch:
        out.append(
            f"{what} {total:,} samples are fewer than one global batch ({world:,} ranks x batch_size {batch:,} = "
            f"{world * batch:,} samples): no step of the job sees a full batch; use a smaller batch_size or fewer "
            "ranks (nodes x gpus_per_node), or more data"
        )
    share = rank_share(total, world, drop_last=drop_last)
    if share == 0:
        out.append(
            f"each rank gets no sample an epoch (drop_last=True: {total:,} samples // {world:,} ranks = 0): every "
            f"rank's epoch is empty, with no batch; use at most {total:,} ranks, drop_last=False (every rank gets "
            "one sample, repeats filling in), or more data"
        )
    elif share < batch:
        how = (
            f"drop_last=True: {total:,} samples // {world:,} ranks, {total - share * world:,} left out"
            if drop_last
            else f"drop_last=False: {total:,} samples / {world:,} ranks rounded up, "
            f"{share * world - total:,} of them repeats"
        )
        out.append(
            f"each rank gets {share:,} sample{'' if share == 1 else 's'} an epoch ({how}), fewer than one batch of "
            f"{batch:,}: every rank's epoch is one short batch of {share:,} sample{'' if share == 1 else 's'}"
            + f"; use batch_size <= {share:,} or fewer ranks, or more data"
        )
    return out


def notes(data: Data, s: PlanSettings, job: JobPlan) -> list[str]:
    """What the figures assume here, in words (``JobPlan.notes``, after the warnings)."""
    out = []
    if data.store == "local":
        out.append(
            "a local dataset: requests, egress and the node cache are what the same dataset would see in a remote "
            "store (locally its files are read in place, with no requests and no cache)"
        )
    if job.byte_ranges != "exact":
        out.append("bytes of shards cut at rank/worker/node boundaries are proportional to their samples")
    if s.cache_bytes:
        out.append(
            "the node cache is simulated per node as LRU of whole shards and tables; entries being read are "
            "pinned, and a fill that finds no unpinned room bypasses the cache (reads its range only)"
        )
        open_bytes = s.gpus_per_node * s.processes * (s.order.max_open_shards + 1) * float(data.nbytes.mean())
        if s.cache_bytes < 4 * open_bytes:
            out.append(
                f"cache_bytes is under 4x what a node's readers hold open ({size(open_bytes)}): which fills bypass "
                "it depends on the order in which lanes that start together reach it, which varies run to run; "
                "expect egress and requests to vary by a few shards"
            )
    if job.cost_per_epoch is not None and (s.price_per_gb is None or s.price_per_1000_gets is None):
        out.append("cost: the price not given counts as 0")
    return out
