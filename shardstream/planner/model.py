"""The job model behind ``shardstream plan``: a training job's data-loading speed, egress,
requests and cost, predicted from the index alone, before the job runs.

What it is built on
-------------------
The assignment is the reader's own: each epoch's plan comes from
:class:`~shardstream.reading.schedule.EpochSchedule` (a mixture: ``MixtureSchedule``, with
the same ``epoch_counts`` and selections), and for every rank and DataLoader worker
:meth:`~shardstream.reading.plan.EpochPlan.piece_runs` gives the runs that worker reads
(``PlanRun(shard, lo, hi)``), O(shards met) per worker. With ``shard_affinity="node"`` the
order is the node-affine one (``NodeLayout``), whose pieces may be parts of shards. A worker's
runs are dealt round-robin to its lanes (``max_open_shards``, fewer when it has fewer runs;
one without shuffle), as :class:`~shardstream.reading.plan.WorkerPlan` deals them. Each lane's
read-ahead settings are cut from :class:`~shardstream.config.FetchConfig` with
:func:`~shardstream.storage.producer.share_read_ahead`, in the order the reader cuts them (the
rank's workers, a mixture's sources, the worker's lanes), so the planner's ``part_bytes`` is
the one each lane's ranged GETs really use.

Bytes of a run
--------------
A run covering a whole shard reads the whole file (``Manifest.shard_bytes``): exact. A run
cut from a shard (at a rank, worker or node boundary) reads a byte range; its bytes are the
shard's bytes x ``run.count / shard samples`` (proportional), or, where the planner read the
cut shards' sample tables (``JobPlan.byte_ranges == "exact"``: a dataset given by location,
few cut shards), exactly the range the reader asks for (``sample_ends``).

Requests (the count rule)
-------------------------
What the reader sends to a remote store, per epoch; retries are not counted:

1. **index**: one GET of ``index.bin`` per rank and source, when the dataset is opened
   (DataLoader workers map the rank's copy): counted in the first epoch.
2. **tables**: one GET of ``NAME.samples`` per run per reading process, unless the process
   still holds it (each DataLoader worker, and each source of a mixture, keeps an LRU of 64
   tables: a fresh process holds none, so a shard met twice by it within 64 runs is fetched
   once; with ``persistent_workers``, or ``workers=0``, the LRU lives on from epoch to epoch
   and is simulated over the runs in the order the lanes reach them). With a node cache, a
   table the process does not hold is looked up in the node cache first (tables are cache
   entries too, of their own size: a hit sends no GET; a miss is fetched and written in).
3. **data**: ranged GETs of the lane's ``part_bytes`` (``p``) over the run's byte range
   ``L`` bytes long: ``ceil(L / p)``; the first run of each lane ramps (its GETs start at
   ``p / 16`` and double up to ``p``: :func:`~shardstream.storage.producer.part_ranges`).
   With a node cache: a hit sends none; a miss fills the whole shard (GETs from the run's
   first byte to the end, the first run of a lane ramping, then from 0 to that byte), and
   its egress is the whole shard; a fill that bypasses the cache (a shard larger than it, or
   no unpinned room: below) reads its range only.
4. No HEADs: the index gives every shard's size (a store whose answers name no version,
   such as the GCS emulator, would add two HEADs a read: not modelled).

For a local dataset the same counts are what it would cost in a remote store (read locally,
files are read in place: no requests, no cache).

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

Start-up (each epoch)
---------------------
Inputs: ``open_s``, ``client_s``, ``worker_start_s`` (given, probed, or defaults: a remote
store's client 0.1 s, a worker 0.05 s, ``open_s = client_s + latency + index bytes /
bandwidth_per_stream``). ``link`` below is the node's bandwidth as the start sees it,
``min(bandwidth_per_node, cpu_bw)`` (``cpu_bw``: Speed); ``G`` the node's GETs in flight with
every lane open, ``L`` a worker's lanes (all its sources'), ``g`` a lane's GETs in flight
(its share of ``max_inflight_requests``), ``p`` its ``part_bytes``; all of worker 0 of rank 0.

- ``t_worker``: each epoch without ``persistent_workers`` (and the first), DataLoader workers
  start: ``worker_start_s``, plus ``client_s`` where the epoch sends any request (a worker
  makes its store client on its first remote read; an epoch of cache hits only makes none).
  0 with ``workers=0``.
- ``t_lanes``: a worker's lanes open one after another (each when the worker first draws a
  sample from it; their interleave is fixed): lane ``k`` costs its table GET and its first
  ramping part, ``2 latency + (table + p/16) / r(k)``, with ``r(k) = min(bandwidth_per_stream,
  link / (G k / L))`` one GET's share while ``k`` lanes of every worker read; the last lane
  only its two latencies. An epoch of cache hits only: no latency, ``link`` the cache disk.
- ``t_turns``: a lane that reads one shard at a time (``max_inflight_shards // lanes`` = 1)
  sends its next shard's first GET once the shard before is read: a latency without bytes per
  run after its first, which the worker waits for (the interleave is fixed): ``latency x
  (ceil(runs / lanes) - 1)``, its busiest reader's.

Speed
-----
Each epoch's time is the largest of these (they run at once), its ``bound_by`` the largest:

- ``step``: the consumer: ``per_rank / (gpu rate)``, the gpu rate ``samples_per_s_per_gpu``
  or ``batch_size / step_time_s`` (neither: unlimited);
- ``network``: ``t_worker + 2 latency`` (the link idles until the first GETs) plus the
  busiest node's egress / its bandwidth, where a node's bandwidth is ``min(bandwidth_per_node,
  ranks x workers x worker rate)`` and a worker's rate is its GETs in flight x ``p / (latency
  + p / bandwidth_per_stream)`` (a reader with too few GETs in flight is latency-bound), or
  the busiest worker's egress / its rate; 0 where the epoch reads nothing from the store;
- ``requests``: the epoch's requests / ``request_rate_limit`` (GETs/s for the whole job);
- ``cpu``: ``t_worker + t_lanes + t_turns`` (the worker waits, its CPU idle) plus the
  larger of the busiest worker's CPU, ``samples read from the store x cpu_s_per_sample +
  cache hits' samples x cpu_s_per_sample_cached``, and the busiest node's CPU over its
  ``cores_per_node``: its workers' CPU + ``store_cpu_s_per_byte`` x its egress (a store or
  proxy on the node, such as a local test server: 0 for a remote store). ``cpu_bw = cores /
  (cpu_s_per_sample / bytes per sample + store_cpu_s_per_byte)`` is the bytes/s those cores
  can take in (unlimited without ``cores_per_node``);
- ``cache``: the busiest node's bytes read from its cache / ``cache_bandwidth_per_node``.

``samples_per_s`` is the whole job's rate in the slowest epoch (``world_size x per_rank /
epoch time``, the epoch's start-up included), ``bound_by`` what bounds that epoch,
``input_bound`` whether it is anything but the step.

``time_to_first_batch_s`` = ``open_s + t_worker + max(t_lanes + t_fill, t_cpu)`` (first
epoch), where ``t_cpu = a x cpu_s_per_sample x max(1, node workers / cores_per_node)`` and
``t_fill`` is the last lane's wait: it needs ``a x share / lanes`` samples (``share``: its
source's part of the worker's samples) at that source's bytes per sample, read by its ramping
GETs (``p/16``, doubling to ``p``) up to the one that covers them (``m`` GETs, ``C`` bytes,
the last of size ``s``) while the ``g - 1`` GETs beside it have read ~``s/2`` each: ``t_fill =
(C + (g - 1) s / 2) / (g x r(L)) + (ceil(m / g) - 1) x latency``, the largest over the
worker's sources. ``a``, the arrivals one worker needs before its first batch leaves its
shuffle buffer: ``ramp + 2 min(B - 1, capacity - ramp) + max(0, B - 1 - (capacity - ramp))``
for a batch of ``B`` (``ramp = ramp_samples(shuffle_buffer)``; without shuffle ``a = B``).
Process start-up (imports) is not counted. The parts are in ``timings["first_batch"]``, each
epoch's start-up terms in ``timings["start_up"]``.
"""

from __future__ import annotations

import collections
import heapq
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from operator import itemgetter
from typing import Any

import numpy as np

from ..config import FetchConfig, S3Config
from ..reading.assign import WorkerSlot
from ..reading.epochs import PassState
from ..reading.mixture import Source, sources_of
from ..reading.plan import per_rank as rank_share
from ..reading.plan import ramp_samples
from ..reading.schedule import EpochSchedule, MixtureSchedule
from ..storage.base import scheme_of
from ..storage.producer import share_read_ahead

__all__ = ["BOUNDS", "STORE_DEFAULTS", "JobPlan", "plan", "plan_counts"]

BOUNDS = ("network", "requests", "cpu", "cache", "step")

# Figures used where a store's are neither given nor probed (listed in JobPlan.assumptions).
STORE_DEFAULTS: dict[str, dict[str, float | None]] = {
    "s3": {
        "latency_ms": 30.0,
        "bandwidth_per_node": 1.25e9,
        "bandwidth_per_stream": 100e6,
        "request_rate_limit": 5500.0,
    },
    "gs": {"latency_ms": 30.0, "bandwidth_per_node": 1.25e9, "bandwidth_per_stream": 100e6, "request_rate_limit": None},
    "az": {"latency_ms": 30.0, "bandwidth_per_node": 1.25e9, "bandwidth_per_stream": 100e6, "request_rate_limit": None},
    "http": {
        "latency_ms": 50.0,
        "bandwidth_per_node": 1.25e9,
        "bandwidth_per_stream": 100e6,
        "request_rate_limit": None,
    },
    "local": {"latency_ms": 0.1, "bandwidth_per_node": 2e9, "bandwidth_per_stream": 2e9, "request_rate_limit": None},
}
_WHY = {
    "latency_ms": "first-byte time of a GET (S3 in-region: tens of ms)",
    "bandwidth_per_node": "a node's link (10 Gb/s = 1.25 GB/s); a local disk: 2 GB/s",
    "bandwidth_per_stream": "one connection's throughput (S3: ~100 MB/s)",
    "request_rate_limit": "S3's 5,500 GET/s per prefix (AWS request-rate guidelines), one prefix",
    "cpu_s_per_sample": "reader CPU parsing one sample, no decode (measure with probe=True)",
    "cache_bandwidth_per_node": "a node's local NVMe disk reading cache entries",
    "cpu_s_per_sample_cached": "reader CPU parsing one sample from a node-cache file (measure with probe=True)",
    "client_s": "making a store client (aiobotocore's S3 client: ~0.1 s of CPU; local files: none)",
    "worker_start_s": "a DataLoader worker's fork and set-up (~0.05 s; measure with probe=True)",
    "open_s": "client_s + the index GET (latency + index bytes / bandwidth_per_stream)",
    "cores_per_node": "a core for each of the node's workers (give cores_per_node where they share fewer)",
    "store_cpu_s_per_byte": "a remote store takes no CPU of the node (a store or proxy on the node would)",
}
DEFAULT_CPU_S_PER_SAMPLE = 5e-5
DEFAULT_CPU_S_PER_SAMPLE_CACHED = 2e-5  # never above cpu_s_per_sample
DEFAULT_CACHE_BANDWIDTH = 2e9
DEFAULT_CLIENT_S = 0.1  # a remote store's client; 0 for local files
DEFAULT_WORKER_START_S = 0.05
_TABLES_KEPT = 64  # a process's LRU of sample tables (index/resolve.py)
_TABLE_HEADER_BYTES = 400  # a sample table's header and column offsets, about
_STAT_TABLES_UP_TO = 200_000  # a local dataset's tables whose sizes are read (stat) rather than estimated
_STEPS_TIMED = 100  # steps in JobPlan.timings["steps"]
_EXACT_CUTS_LOCAL = 4096  # cut shards whose tables the planner reads for exact byte ranges
_EXACT_CUTS_REMOTE = 256


@dataclass
class JobPlan:
    """What :func:`plan` predicts for a job (module doc). Sizes are bytes, times seconds,
    rates per second; lists have one entry per epoch. :meth:`to_dict` is JSON-ready; ``str()``
    is :meth:`table`.

    Attributes:
        inputs: the arguments, echoed.
        figures: the store figures used (latency_ms, bandwidth_per_node, bandwidth_per_stream,
            request_rate_limit, cpu_s_per_sample, cache_bandwidth_per_node), each with where
            it came from ("given", "probed" or "assumed").
        assumptions: the figures assumed, with the default and why.
        time_to_first_batch_s: until the first batch of a worker is ready (module doc).
        samples_per_s: the whole job's steady samples/s in the slowest epoch.
        input_bound: that epoch is bound by anything but the step.
        bound_by: "network", "requests", "cpu", "cache" or "step".
        egress_bytes_per_epoch: shard bytes read from the store.
        egress_detail: per epoch, the bytes of shards (``data``), sample tables and index.bin.
        requests_per_epoch: requests to the store (index GETs in the first epoch);
            ``requests_detail``: per epoch, of the index, tables and data.
        cache_hit_rate: hits / accesses of the node caches (0 without a cache).
        min_cache_bytes_per_node: the node cache at which epochs after the first read
            nothing from the store (``min_cache_note`` says what it means here).
        cost_per_epoch: egress and request prices, per epoch (None without prices).
        recommendations: ``{"setting", "value", "reason"}`` dicts.
        notes: what the figures assume, and the warnings, in words.
        warnings: what will go wrong with this job's shape, each with what to do: an epoch
            of fewer samples than one global batch (``world_size x batch_size``), a rank
            given fewer samples than one batch an epoch (also in ``notes``).
        timings: ``steps`` (first steps: step, time_s, samples_per_s), ``cache`` (per epoch:
            bytes held per node, mean and max, and the hit rate), ``epochs`` (each epoch's
            time per bound).
    """

    inputs: dict[str, Any]
    figures: dict[str, dict[str, Any]]
    assumptions: list[dict[str, Any]]
    dataset: dict[str, Any]
    world_size: int
    samples_per_epoch: int
    time_to_first_batch_s: float
    samples_per_s: float
    input_bound: bool
    bound_by: str
    samples_per_s_per_epoch: list[float]
    bound_by_per_epoch: list[str]
    epoch_time_s: list[float]
    job_time_s: float
    egress_bytes_per_epoch: list[int]
    egress_detail: list[dict[str, int]]
    requests_per_epoch: list[int]
    requests_detail: list[dict[str, int]]
    cache_hit_rate: list[float]
    min_cache_bytes_per_node: int
    min_cache_note: str
    cost_per_epoch: list[float] | None
    recommendations: list[dict[str, Any]]
    timings: dict[str, Any]
    byte_ranges: str
    probe: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    compute_s: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every attribute, JSON-ready (numbers, strings, lists, dicts)."""
        return _plain({k: getattr(self, k) for k in self.__dataclass_fields__})

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def table(self) -> str:
        """The plan as a readable text table."""
        d = self.dataset
        rows = [
            f"dataset       {d['num_shards']:,} shards, {d['num_samples']:,} samples, {_size(d['bytes'])}"
            f" ({d['store']})",
            f"job           {self.inputs['nodes']} nodes x {self.inputs['gpus_per_node']} GPUs x "
            f"{self.inputs['workers']} workers, batch {self.inputs['batch_size']}, "
            f"{self.samples_per_epoch:,} samples/epoch",
            f"first batch   {_duration(self.time_to_first_batch_s)}",
            f"speed         {self.samples_per_s:,.0f} samples/s (whole job), bound by {self.bound_by}"
            + (" (input-bound)" if self.input_bound else " (the GPUs set the pace)"),
            f"job time      {_duration(self.job_time_s)} for {len(self.epoch_time_s)} epochs",
            f"min cache     {_size(self.min_cache_bytes_per_node)} per node ({self.min_cache_note})",
            "",
            f"{'epoch':>5}  {'egress':>10}  {'requests':>12}  {'cache hits':>10}  {'samples/s':>12}  {'bound':>8}"
            f"  {'time':>9}" + ("  cost" if self.cost_per_epoch is not None else ""),
        ]
        for e in range(len(self.epoch_time_s)):
            row = (
                f"{e:>5}  {_size(self.egress_bytes_per_epoch[e]):>10}  {self.requests_per_epoch[e]:>12,}  "
                f"{self.cache_hit_rate[e]:>10.1%}  {self.samples_per_s_per_epoch[e]:>12,.0f}  "
                f"{self.bound_by_per_epoch[e]:>8}  {_duration(self.epoch_time_s[e]):>9}"
            )
            if self.cost_per_epoch is not None:
                cost = self.cost_per_epoch[e]
                row += f"  ${cost:,.2f}" if cost >= 0.01 or cost == 0 else f"  ${_sig(cost, 2)}"
            rows.append(row)
        rows += ["", "figures:"]
        for name, fig in self.figures.items():
            rows.append(f"  {name:<26} {_figure(name, fig['value']):>16}  ({fig['source']})")
        if self.recommendations:
            rows += ["", "recommendations:"]
            rows += [
                f"  {r['setting']} = {_setting_value(r['setting'], r['value'])}: {r['reason']}"
                for r in self.recommendations
            ]
        if self.notes:
            rows += ["", "notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


# ----------------------------------------------------------------------------------------------
# the public entry points


def plan(
    dataset: str | os.PathLike[str] | Sequence[Source],
    *,
    nodes: int = 1,
    gpus_per_node: int = 1,
    workers: int = 2,
    batch_size: int = 64,
    step_time_s: float | None = None,
    samples_per_s_per_gpu: float | None = None,
    cache_bytes: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    shuffle_buffer: int = 1000,
    max_open_shards: int = 4,
    drop_last: bool = False,
    shard_affinity: str | None = None,
    epochs: int = 2,
    latency_ms: float | None = None,
    bandwidth_per_node: float | None = None,
    request_rate_limit: float | None = None,
    price_per_gb: float | None = None,
    price_per_1000_gets: float | None = None,
    cpu_s_per_sample: float | None = None,
    probe: bool = False,
    s3: S3Config | None = None,
    fetch: FetchConfig | None = None,
    bandwidth_per_stream: float | None = None,
    cache_bandwidth_per_node: float | None = None,
    persistent_workers: bool = False,
    epoch_samples: int | None = None,
    mix: str = "stratified",
    decode: Any = None,
    cpu_s_per_sample_cached: float | None = None,
    open_s: float | None = None,
    client_s: float | None = None,
    worker_start_s: float | None = None,
    cores_per_node: int | None = None,
) -> JobPlan:
    """Predict a training job's data loading from its dataset's index (module doc).

    Args:
        dataset: a dataset location as ``ShardDataset`` takes it (a directory, a remote
            prefix, or its index file), or a list of :class:`~shardstream.Source` (a mixture).
        nodes, gpus_per_node: the job: ``nodes x gpus_per_node`` ranks (``world_size``).
        workers: DataLoader workers per rank (0: the rank reads in its own process).
        batch_size: the DataLoader's batch size (and ``ShardDataset(batch_size=)``).
        step_time_s, samples_per_s_per_gpu: the consumer's pace, one of them (None: unlimited).
        cache_bytes: the node cache per node, bytes (0: no cache).
        shuffle, seed, shuffle_buffer, max_open_shards, drop_last: as ``ShardDataset``.
        shard_affinity: None or ``"node"`` (ranks ``n * gpus_per_node ..`` are node ``n``).
        epochs: epochs to plan (>= 1).
        latency_ms: first-byte time of a GET, milliseconds.
        bandwidth_per_node: bytes/s a node reads from the store.
        request_rate_limit: GETs/s the store serves the whole job.
        price_per_gb, price_per_1000_gets: egress price per 10^9 bytes, price per 1,000 GETs.
        cpu_s_per_sample: reader CPU seconds per sample, per worker process.
        probe: measure latency, bandwidth, CPU (from the store and from a node cache), the
            cache disk, a local store's CPU, start-up (a worker, a client, opening the
            dataset) and the cores from this machine against the dataset's store (figures
            given as arguments win over probed ones; :mod:`~shardstream.planner.probe`).
        s3: the S3 endpoint for ``s3://`` datasets; fetch: the readers' FetchConfig.
        bandwidth_per_stream: bytes/s of one connection.
        cache_bandwidth_per_node: bytes/s a node reads from its cache's disk.
        persistent_workers: the DataLoader's (workers keep their tables across epochs).
        epoch_samples, mix: a mixture's, as ``ShardDataset``.
        decode: what the probe times the reader's CPU with (``ShardDataset(decode=)``).
        cpu_s_per_sample_cached: reader CPU seconds per sample read from the node cache.
        open_s: seconds to open the dataset in a rank (``ShardDataset(...)``: its store client
            made, the index read).
        client_s: seconds a process spends making its store client (each DataLoader worker
            makes one on its first remote read).
        worker_start_s: seconds from a DataLoader iterator's creation until a worker runs
            (fork and set-up; its client not included).
        cores_per_node: CPU cores the node's readers share (None: with ``probe``, this
            machine's ``os.cpu_count()``; without, a core for each worker).

    Returns:
        the :class:`JobPlan`.

    Raises:
        ValueError: an argument out of range (named, with what to pass), a mixture with
            ``shard_affinity``, or a dataset without an index.
        ShardNotFoundError, IndexFormatError: as :func:`~shardstream.open_index`.
    """
    args = _checked_args(locals())
    opened = _time_open(dataset, s3=s3, fetch=fetch, epoch_samples=epoch_samples, mix=mix) if probe else None
    data = _open(dataset, s3=s3, epoch_samples=epoch_samples, mix=mix, shard_affinity=shard_affinity)
    probed = None
    if probe:
        from .probe import probe as run_probe

        probed = run_probe(data.location_for_probe, s3=s3, fetch=fetch, decode=decode)
        probed["open_s"] = opened if opened is not None else data.open_s
    return _plan(data, args, probed)


def plan_counts(
    counts: Sequence[int] | np.ndarray,
    shard_bytes: Sequence[int] | np.ndarray,
    *,
    store: str = "s3",
    shard_members: Sequence[int] | np.ndarray | None = None,
    **kwargs: Any,
) -> JobPlan:
    """:func:`plan` of a dataset given as arrays, without writing it: ``counts`` (samples per
    shard) and ``shard_bytes`` (bytes per shard), in index order, in a store of kind ``store``
    (``"s3"``, ``"gs"``, ``"az"``, ``"http"`` or ``"local"``: its default figures);
    ``shard_members``: members per shard (default: one per sample). ``kwargs``: :func:`plan`'s
    (not ``probe``; byte ranges of cut shards are proportional).

    Raises:
        ValueError: arrays of other lengths, negative entries, an unknown store, or a bad
            argument (as :func:`plan`).
    """
    counts = np.asarray(counts, dtype=np.int64)
    nbytes = np.asarray(shard_bytes, dtype=np.int64)
    if counts.ndim != 1 or counts.shape != nbytes.shape:
        raise ValueError(
            f"counts and shard_bytes must be 1-d arrays of one length (got {counts.shape} and {nbytes.shape})"
        )
    if len(counts) == 0 or counts.min() < 0 or nbytes.min() < 0 or counts.sum() == 0:
        raise ValueError("counts and shard_bytes need at least one shard, no negative entry and some samples")
    if store not in STORE_DEFAULTS:
        raise ValueError(f"store={store!r} must be one of {', '.join(STORE_DEFAULTS)}")
    if kwargs.get("probe"):
        raise ValueError("probe=True needs a dataset's location: call plan(location, probe=True)")
    members = counts if shard_members is None else np.asarray(shard_members, dtype=np.int64)
    args = _checked_args({**_DEFAULTS, **kwargs})
    data = _Data(
        counts=counts,
        nbytes=nbytes,
        members=members,
        source_starts=[0, len(counts)],
        names=["arrays"],
        store=store,
        index_bytes=[51 * len(counts) + 416],
    )
    return _plan(data, args, None)


# ----------------------------------------------------------------------------------------------
# arguments and the dataset


_DEFAULTS: dict[str, Any] = {
    "nodes": 1,
    "gpus_per_node": 1,
    "workers": 2,
    "batch_size": 64,
    "step_time_s": None,
    "samples_per_s_per_gpu": None,
    "cache_bytes": 0,
    "shuffle": True,
    "seed": 0,
    "shuffle_buffer": 1000,
    "max_open_shards": 4,
    "drop_last": False,
    "shard_affinity": None,
    "epochs": 2,
    "latency_ms": None,
    "bandwidth_per_node": None,
    "request_rate_limit": None,
    "price_per_gb": None,
    "price_per_1000_gets": None,
    "cpu_s_per_sample": None,
    "probe": False,
    "s3": None,
    "fetch": None,
    "bandwidth_per_stream": None,
    "cache_bandwidth_per_node": None,
    "persistent_workers": False,
    "epoch_samples": None,
    "mix": "stratified",
    "decode": None,
    "cpu_s_per_sample_cached": None,
    "open_s": None,
    "client_s": None,
    "worker_start_s": None,
    "cores_per_node": None,
}


def _checked_args(given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (plan's arguments) checked; ValueError naming the first bad one."""
    unknown = sorted(set(given) - set(_DEFAULTS) - {"dataset"})
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}; plan() takes {', '.join(_DEFAULTS)}")
    a = {k: given.get(k, v) for k, v in _DEFAULTS.items()}
    for name, low in (("nodes", 1), ("gpus_per_node", 1), ("workers", 0), ("batch_size", 1), ("epochs", 1)):
        value = a[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name}={value!r} must be an int >= {low}")
    for name in ("shuffle_buffer", "seed"):
        if not isinstance(a[name], int) or isinstance(a[name], bool) or (name == "shuffle_buffer" and a[name] < 0):
            raise ValueError(f"{name}={a[name]!r} must be an int" + (" >= 0" if name == "shuffle_buffer" else ""))
    if not isinstance(a["max_open_shards"], int) or a["max_open_shards"] < 1:
        raise ValueError(f"max_open_shards={a['max_open_shards']!r} must be an int >= 1")
    if not isinstance(a["cache_bytes"], int) or isinstance(a["cache_bytes"], bool) or a["cache_bytes"] < 0:
        raise ValueError(f"cache_bytes={a['cache_bytes']!r} must be an int >= 0 (bytes per node; 0: no cache)")
    if a["step_time_s"] is not None and a["samples_per_s_per_gpu"] is not None:
        raise ValueError("give step_time_s or samples_per_s_per_gpu, not both (the consumer's pace, one way)")
    for name in (
        "step_time_s",
        "samples_per_s_per_gpu",
        "latency_ms",
        "bandwidth_per_node",
        "request_rate_limit",
        "cpu_s_per_sample",
        "bandwidth_per_stream",
        "cache_bandwidth_per_node",
        "cpu_s_per_sample_cached",
    ):
        value = a[name]
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ValueError(f"{name}={value!r} must be a number > 0, or None (the default figure)")
    for name in ("open_s", "client_s", "worker_start_s"):
        value = a[name]
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"{name}={value!r} must be a number >= 0 (seconds), or None (the default figure)")
    cores = a["cores_per_node"]
    if cores is not None and (not isinstance(cores, int) or isinstance(cores, bool) or cores < 1):
        raise ValueError(f"cores_per_node={cores!r} must be an int >= 1, or None")
    if a["latency_ms"] is not None and a["latency_ms"] <= 0:
        raise ValueError(f"latency_ms={a['latency_ms']!r} must be > 0")
    for name in ("price_per_gb", "price_per_1000_gets"):
        value = a[name]
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"{name}={value!r} must be a number >= 0 (dollars), or None")
    if a["shard_affinity"] not in (None, "node"):
        raise ValueError(f"shard_affinity={a['shard_affinity']!r} must be None or 'node'")
    if a["fetch"] is not None and not isinstance(a["fetch"], FetchConfig):
        raise ValueError(f"fetch={a['fetch']!r} must be a shardstream.FetchConfig or None")
    return a


@dataclass
class _Data:
    """The shards of a dataset or mixture (sources laid end to end) as arrays."""

    counts: np.ndarray
    nbytes: np.ndarray
    members: np.ndarray
    source_starts: list[int]
    names: list[str]
    store: str
    index_bytes: list[int]
    sources: list[Source] | None = None
    epoch_samples: int | None = None
    mix: str = "stratified"
    indexes: list[Any] | None = None
    location_for_probe: str | None = None
    table_bytes: np.ndarray = field(default=None)  # type: ignore[assignment]
    open_s: float | None = None  # the planner's opening of the index(es), timed

    def __post_init__(self) -> None:
        if self.table_bytes is None:  # NAME.samples: a header, 24 B a sample, ~50 B a member (its name)
            self.table_bytes = _TABLE_HEADER_BYTES + 24 * self.counts + 50 * self.members

    @property
    def num_sources(self) -> int:
        return len(self.source_starts) - 1


class _Counts:
    """A ShardSet's two attributes the schedules read (sample counts, shards)."""

    def __init__(self, counts: np.ndarray) -> None:
        self.sample_counts = counts
        self.num_shards = len(counts)


def _store_kind(location: str) -> str:
    scheme = scheme_of(location)
    if scheme is None:
        return "local"
    if scheme in ("s3", "gs", "az"):
        return scheme
    return "http"  # http(s), the Hub


def _open(
    dataset: Any, *, s3: S3Config | None, epoch_samples: int | None, mix: str, shard_affinity: str | None
) -> _Data:
    from ..index.resolve import open_index

    sources = sources_of(dataset)
    if sources is not None and len(sources) == 1 and sources[0].rule() == {"repeat": 1.0} and epoch_samples is None:
        dataset, sources = sources[0].location, None  # one whole source: a plain dataset, as the reader does
    if sources is None:
        if isinstance(dataset, (list, tuple)):
            raise ValueError(
                "plan() needs a dataset location with an index (or a list of Source); shard URLs without an "
                "index have no sample counts to plan with: pack them or `shardstream index build` them"
            )
        if epoch_samples is not None:
            raise ValueError(f"{epoch_samples=} sets a mixture's epoch size; pass a list of Source(...) to mix")
        locations = [os.fspath(dataset)]
    else:
        if shard_affinity is not None:
            raise ValueError(
                "shard_affinity='node' is not supported for a mixture yet (ShardDataset refuses it too); plan the "
                "mixture without it"
            )
        locations = [os.fspath(src.location) for src in sources]  # type: ignore[arg-type]
    _import_client_library(locations)  # imports are process start-up: not in open_s
    began = time.perf_counter()
    indexes = [open_index(loc, s3=s3) for loc in locations]
    open_s = time.perf_counter() - began
    counts = [np.asarray(ix.manifest.shard_samples, np.int64) for ix in indexes]
    index_bytes = []
    for loc, ix in zip(locations, indexes):
        path = ix.manifest.url
        size = os.path.getsize(path) if scheme_of(loc) is None and os.path.isfile(path) else None
        index_bytes.append(size or 51 * ix.num_shards + 416)
    table_bytes = None
    if all(scheme_of(loc) is None for loc in locations) and sum(ix.num_shards for ix in indexes) <= _STAT_TABLES_UP_TO:
        try:
            table_bytes = np.asarray(
                [
                    os.path.getsize(os.path.join(ix.root, ix.manifest.table_name(i)))
                    for ix in indexes
                    for i in range(ix.num_shards)
                ],
                np.int64,
            )
        except OSError:  # a table missing or elsewhere: estimated
            table_bytes = None
    return _Data(
        table_bytes=table_bytes,  # type: ignore[arg-type]
        counts=np.concatenate(counts),
        nbytes=np.concatenate([np.asarray(ix.manifest.shard_bytes, np.int64) for ix in indexes]),
        members=np.concatenate([np.asarray(ix.manifest.shard_members, np.int64) for ix in indexes]),
        source_starts=[0, *np.cumsum([len(c) for c in counts]).tolist()],
        names=[src.label for src in sources] if sources is not None else [locations[0]],
        store=_store_kind(locations[0]),
        index_bytes=index_bytes,
        sources=sources,
        epoch_samples=epoch_samples,
        mix=mix,
        indexes=indexes,
        location_for_probe=locations[0],
        open_s=open_s,
    )


def _time_open(dataset: Any, *, s3: Any, fetch: Any, epoch_samples: int | None, mix: str) -> float | None:
    """Seconds to make the job's ``ShardDataset`` here, the first store access of this process
    (its client made cold, the index read, the reader set up), as a rank opens it; imports
    first (start-up, not counted). None where it cannot be made here (torch missing)."""
    try:
        from ..dataset import ShardDataset
    except ImportError:
        return None
    sources = sources_of(dataset)
    _import_client_library([os.fspath(s.location) for s in sources] if sources else [os.fspath(dataset)])
    kwargs = {"epoch_samples": epoch_samples, "mix": mix} if sources is not None else {}
    began = time.perf_counter()
    try:
        ShardDataset(dataset, s3=s3, fetch=fetch, shuffle=False, **kwargs)
    except Exception:  # noqa: BLE001 (the planner's own open raises what is wrong)
        return None
    return time.perf_counter() - began


def _import_client_library(locations: list[str]) -> None:
    """Import an S3 store's client library (aiobotocore) now, so opening the index times the
    client's creation and the index GET, not the import (process start-up)."""
    if any(scheme_of(loc) == "s3" for loc in locations):
        try:
            import aiobotocore.config
            import aiobotocore.session  # noqa: F401
        except ImportError:  # opening the index says what is missing
            pass


# ----------------------------------------------------------------------------------------------
# the model


@dataclass
class _Epoch:
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


def _schedule(data: _Data, a: dict[str, Any], world: int) -> Any:
    order = dict(
        seed=a["seed"],
        shuffle=a["shuffle"],
        shuffle_buffer=a["shuffle_buffer"],
        max_open_shards=a["max_open_shards"],
        drop_last=a["drop_last"],
        batch_size=a["batch_size"],
    )
    if data.num_sources == 1 and data.sources is None:
        if a["shard_affinity"] is None:
            return EpochSchedule(_Counts(data.counts), **order)
        try:
            from ..reading.assign import NodeAffinity

            return EpochSchedule(_Counts(data.counts), **order, shard_affinity=NodeAffinity(a["gpus_per_node"]))
        except (ImportError, TypeError) as exc:
            raise NotImplementedError(
                "shard_affinity='node' needs the node-affine epoch plan (reading/plan.py NodeLayout), which this "
                "version of shardstream lacks; plan without it"
            ) from exc
    sets = [_Counts(data.counts[data.source_starts[s] : data.source_starts[s + 1]]) for s in range(data.num_sources)]
    return MixtureSchedule(data.sources, sets, epoch_samples=data.epoch_samples, mix=data.mix, **order)


class _Fetches:
    """Each reader's lanes' FetchConfig, cut as the reader cuts it (module doc), kept per shape."""

    def __init__(self, fetch: FetchConfig, workers: int) -> None:
        self.worker = share_read_ahead(fetch, Fraction(1, max(1, workers)))  # engine.share_buffer
        self.kept: dict[tuple[Any, int], tuple[int, int]] = {}

    def lanes(self, share: float | None, requests: int | None, lanes: int) -> tuple[int, int]:
        """(part_bytes, GETs in flight at most) of a reader with ``lanes`` lanes (``share`` of
        the worker's: a mixture source's, with its ``requests``)."""
        key = (share, requests, lanes)
        if key not in self.kept:
            fetch = self.worker
            if share is not None:  # engine.read_mixed
                fetch = share_read_ahead(fetch, share, requests=requests)
            if lanes > 1:  # engine.ReadingEngine.read_plan
                fetch = share_read_ahead(
                    fetch,
                    Fraction(1, lanes),
                    requests=max(1, fetch.max_inflight_requests // lanes),
                    shards=max(1, fetch.max_inflight_shards // lanes),
                )
            per_lane = min(fetch.max_inflight_requests, max(1, fetch.max_buffer_bytes // fetch.part_bytes))
            self.kept[key] = (fetch.part_bytes, per_lane * lanes)
        return self.kept[key]


def _epoch_runs(data: _Data, a: dict[str, Any], schedule: Any, epoch: int, fetches: _Fetches) -> _Epoch:
    """Every worker's runs of ``epoch`` from the reader's own plan (module doc)."""
    world = a["nodes"] * a["gpus_per_node"]
    workers = max(1, a["workers"])
    slot = WorkerSlot(rank=0, world_size=world, worker_id=0, num_workers=workers)
    mixture = data.sources is not None
    the_plan = schedule.plan(PassState(epoch, []), slot) if not mixture else schedule.plan(PassState(epoch, []))
    runs: list[Any] = []
    lengths, shard_base = [], []
    r_node, r_proc, r_lanes, r_part, r_inflight = [], [], [], [], []
    for rank in range(world):
        for w in range(workers):
            if not mixture:
                mine = the_plan.piece_runs(
                    None, world_size=world, rank=rank, num_workers=workers, worker_id=w, batch_size=a["batch_size"]
                )
                lanes = max(1, min(the_plan.max_open_shards, len(mine))) if the_plan.shuffle else 1  # WorkerPlan
                readers = [(mine, lanes, None, None, 0)]
            else:
                mwp = the_plan.worker_plan(
                    None,
                    seg=0,
                    world_size=world,
                    rank=rank,
                    num_workers=workers,
                    worker_id=w,
                    batch_size=a["batch_size"],
                )
                reals = schedule.real_plans(mwp, epoch)
                total = max(1, sum(p.count for p in reals))
                readers = []
                for s, p in enumerate(reals):
                    share = p.count / total
                    requests = max(1, round(fetches.worker.max_inflight_requests * share))
                    readers.append((p.runs, p.lanes, share, requests, data.source_starts[s]))
            for mine, lanes, share, requests, base in readers:
                part, inflight = fetches.lanes(share, requests, lanes)
                runs += mine
                lengths.append(len(mine))
                shard_base.append(base)
                r_node.append(rank // a["gpus_per_node"])
                r_proc.append(rank * workers + w)
                r_lanes.append(lanes)
                r_part.append(part)
                r_inflight.append(inflight)
    n = len(runs)
    lengths_a = np.asarray(lengths, np.int64)
    reader = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths_a)
    starts = np.concatenate([[0], np.cumsum(lengths_a)])
    shard = np.fromiter(map(itemgetter(0), runs), np.int64, count=n) + np.asarray(shard_base, np.int64)[reader]
    return _Epoch(
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


def gets(length: np.ndarray, part: np.ndarray, ramp: np.ndarray) -> np.ndarray:
    """Ranged GETs reading ``length`` bytes in parts of ``part`` (arrays, one entry per read),
    ramping (``ramp``: from ``part / 16``, doubling) as
    :func:`~shardstream.storage.producer.part_ranges` cuts them."""
    length = np.asarray(length, np.int64)
    part = np.broadcast_to(np.asarray(part, np.int64), length.shape)
    ramp = np.broadcast_to(np.asarray(ramp, bool), length.shape)
    out = -(-length // part)
    for p in np.unique(part[ramp]).tolist():
        sizes, size = [], max(1, p // 16)
        while size < p:
            sizes.append(size)
            size = min(size * 2, p)
        if not sizes:
            continue
        cum = np.cumsum(sizes)
        sel = ramp & (part == p)
        n = length[sel]
        small = np.searchsorted(cum, n, side="left") + 1
        big = len(sizes) + -(-(n - cum[-1]) // p)
        out[sel] = np.where(n <= 0, 0, np.where(n <= cum[-1], small, big))
    return np.maximum(out, 0)


def _lane_progress(ep: _Epoch, counts: np.ndarray) -> np.ndarray:
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


class _Ranges:
    """Byte ranges of runs: whole shards exactly, cut ones from their sample tables when read
    (exact) or in proportion to their samples."""

    def __init__(self, data: _Data, exact: bool) -> None:
        self.data, self.exact, self.ends = data, exact, {}

    def of(self, ep: _Epoch) -> tuple[np.ndarray, np.ndarray]:
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


def _table_gets(ep: _Epoch, t: np.ndarray, kept: dict[int, collections.OrderedDict] | None) -> np.ndarray:
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
        again = np.concatenate([[False], (r[1:] == r[:-1]) & (s[1:] == s[:-1]) & (i[1:] - i[:-1] < _TABLES_KEPT)])
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
            if len(lru) > _TABLES_KEPT:
                lru.popitem(last=False)
    return np.asarray(out, np.int64)


def _plan(data: _Data, a: dict[str, Any], probed: dict[str, Any] | None) -> JobPlan:
    began = time.perf_counter()
    nodes, gpn = a["nodes"], a["gpus_per_node"]
    world = nodes * gpn
    workers = max(1, a["workers"])
    fetch = a["fetch"] or FetchConfig()
    figures, assumptions = _figures(data.store, a, probed, max(data.index_bytes))
    lat = figures["latency_ms"]["value"] / 1e3
    bw_node = figures["bandwidth_per_node"]["value"]
    bw_stream = figures["bandwidth_per_stream"]["value"]
    rate_limit = figures["request_rate_limit"]["value"]
    cpu_s = figures["cpu_s_per_sample"]["value"]
    cpu_cached = figures["cpu_s_per_sample_cached"]["value"]
    cache_bw = figures["cache_bandwidth_per_node"]["value"]
    client_s = figures["client_s"]["value"]
    worker_start = figures["worker_start_s"]["value"] if a["workers"] else 0.0
    cores = figures["cores_per_node"]["value"]
    store_cpu = figures["store_cpu_s_per_byte"]["value"]
    cap = a["cache_bytes"]
    # the node's readers share its cores: CPU times stretch by processes / cores where fewer
    contention = max(1.0, gpn * workers / cores) if cores else 1.0
    per_sample_bytes = float(data.nbytes.sum()) / max(1, int(data.counts.sum()))
    # bytes/s the node's cores can take in: each byte costs the reader's CPU and a local store's
    cpu_bw = cores / (cpu_s / per_sample_bytes + store_cpu) if cores else math.inf

    schedule = _schedule(data, a, world)
    fetches = _Fetches(fetch, a["workers"])
    cut_limit = _EXACT_CUTS_LOCAL if data.store == "local" else _EXACT_CUTS_REMOTE
    exact = data.indexes is not None and a["epochs"] * world * workers * data.num_sources <= cut_limit
    ranges = _Ranges(data, exact)
    persistent = a["persistent_workers"] or a["workers"] == 0

    # Per epoch, per run: what a cache hit, a fill and a plain read would cost.
    per_epoch = []
    kept_tables: dict[int, collections.OrderedDict] | None = {} if persistent else None
    for e in range(a["epochs"]):
        ep = _epoch_runs(data, a, schedule, e, fetches)
        count = ep.hi - ep.lo + 1
        first, last = ranges.of(ep)
        part = ep.r_part[ep.reader]
        ramp = ep.idx < ep.r_lanes[ep.reader]
        size = data.nbytes[ep.shard]
        progress = _lane_progress(ep, count)
        per_epoch.append(
            {
                "ep": ep,
                "count": count,
                "node": ep.r_node[ep.reader],
                "t": progress,
                "read_bytes": last - first,
                "read_gets": gets(last - first, part, ramp),
                "fill_gets": gets(size - first, part, ramp) + gets(first, part, np.zeros(len(first), bool)),
                "size": size,
                "table_runs": np.flatnonzero(_table_gets(ep, progress, kept_tables)),
                "table_size": data.table_bytes[ep.shard],
            }
        )

    outcome = _simulate_cache(per_epoch, nodes, cap, len(data.counts))  # 0 hit, 1 fill, 2 read past the cache

    samples_per_epoch = world * rank_share(_epoch_total(data, schedule), world, drop_last=a["drop_last"])
    pace = None
    if a["samples_per_s_per_gpu"] is not None:
        pace = float(a["samples_per_s_per_gpu"])
    elif a["step_time_s"] is not None:
        pace = a["batch_size"] / a["step_time_s"]

    egress, egress_detail, requests, detail, hit_rate = [], [], [], [], []
    times, rates, bounds, cache_held = [], [], [], []
    starts = []
    for e, (x, got) in enumerate(zip(per_epoch, outcome)):
        ep = x["ep"]
        asked = len(x["table_runs"])
        table_got, got = got[:asked], got[asked:]  # the table accesses, then the shards'
        hit, fill = got == 0, got == 1
        moved = np.where(fill, x["size"], np.where(hit, 0, x["read_bytes"]))
        data_gets = np.where(fill, x["fill_gets"], np.where(hit, 0, x["read_gets"]))
        index_gets = world * data.num_sources if e == 0 else 0
        table_fetched = x["table_runs"][table_got != 0]
        egress.append(int(moved.sum()))
        egress_detail.append(
            {"data": int(moved.sum()), "tables": int(x["table_size"][table_fetched].sum()), "index": 0}
        )
        if e == 0:
            egress_detail[0]["index"] = world * sum(data.index_bytes)
        detail.append({"index": index_gets, "tables": len(table_fetched), "data": int(data_gets.sum())})
        requests.append(sum(detail[-1].values()))
        hit_rate.append(float(hit.mean()) if cap and len(hit) else 0.0)
        # speed: each resource's time for this epoch (module doc)
        node_egress = np.bincount(x["node"], weights=moved, minlength=nodes)
        node_hits = np.bincount(x["node"], weights=np.where(hit, x["read_bytes"], 0), minlength=nodes)
        proc_samples = np.bincount(ep.r_proc[ep.reader], weights=x["count"], minlength=world * workers)
        reader_egress = np.bincount(ep.reader, weights=moved, minlength=len(ep.r_part))
        proc_egress = np.bincount(ep.r_proc, weights=reader_egress, minlength=world * workers)
        part_typ = float(np.median(ep.r_part)) if len(ep.r_part) else fetch.part_bytes
        inflight = np.bincount(ep.r_proc, weights=ep.r_inflight, minlength=world * workers)
        inflight_typ = float(np.median(inflight)) if len(inflight) else 1.0
        worker_rate = inflight_typ * part_typ / (lat + part_typ / bw_stream)
        node_bw = min(bw_node, gpn * workers * worker_rate)
        # the epoch's start-up (module doc, "Start-up"): workers (re)started, their lanes opened
        remote = requests[-1] > 0
        restart = e == 0 or not persistent
        t_worker = (worker_start + (client_s if remote else 0.0)) if restart and a["workers"] else 0.0
        link = min(bw_node, cpu_bw) if remote else cache_bw
        lanes = _Lanes(x, data, lat if remote else 0.0, link, bw_stream, fetches)
        t_open = lanes.open_s()
        t_turns = lanes.turns_s() if remote else 0.0
        starts.append({"workers_s": t_worker, "lanes_s": t_open, "shard_turns_s": t_turns})
        proc_hit_samples = np.bincount(
            ep.r_proc[ep.reader], weights=np.where(hit, x["count"], 0), minlength=world * workers
        )
        proc_cpu = (proc_samples - proc_hit_samples) * cpu_s + proc_hit_samples * cpu_cached
        proc_node = np.arange(world * workers) // (gpn * workers)
        node_cpu = np.bincount(proc_node, weights=proc_cpu, minlength=nodes) + store_cpu * node_egress
        t = {
            "network": t_worker + 2 * lat + float(max(node_egress.max() / node_bw, proc_egress.max() / worker_rate))
            if node_egress.max() > 0
            else 0.0,
            "requests": requests[-1] / rate_limit if rate_limit else 0.0,
            "cpu": t_worker + t_open + t_turns + float(max(proc_cpu.max(), node_cpu.max() / (cores or math.inf))),
            "cache": float(node_hits.max()) / cache_bw if cap else 0.0,
            "step": samples_per_epoch / world / pace if pace else 0.0,
        }
        bound = max(BOUNDS, key=lambda k: t[k])
        epoch_time = max(t[bound], 1e-12)
        times.append({k: float(v) for k, v in t.items()})
        rates.append(samples_per_epoch / epoch_time)
        bounds.append(bound)
        cache_held.append(x.get("held", None))

    slowest = int(np.argmin(rates))
    epoch_time_s = [max(t.values()) for t in times]
    min_cache, min_note = _min_cache(data, per_epoch, a, nodes)
    costs = None
    if a["price_per_gb"] is not None or a["price_per_1000_gets"] is not None:
        gb, gets_price = a["price_per_gb"] or 0.0, a["price_per_1000_gets"] or 0.0
        costs = [sum(eg.values()) / 1e9 * gb + rq / 1000 * gets_price for eg, rq in zip(egress_detail, requests)]

    bytes_per_sample = float(data.nbytes.sum()) / max(1, int(data.counts.sum()))
    ttfb, ttfb_parts = _first_batch(
        per_epoch[0],
        data,
        a,
        fetches,
        lat=lat,
        bw_stream=bw_stream,
        bw_node=min(bw_node, cpu_bw),
        cpu_s=cpu_s * contention,
        open_s=figures["open_s"]["value"],
        t_worker=starts[0]["workers_s"],
    )
    first_input_rate = samples_per_epoch / max(max(v for k, v in times[0].items() if k != "step"), 1e-12)
    steps = _step_timings(ttfb, first_input_rate / world, pace, a["batch_size"], world, samples_per_epoch // world)
    job = JobPlan(
        inputs={k: _echo(v) for k, v in a.items() if k not in ("decode",)} | {"dataset": data.names},
        figures=figures,
        assumptions=assumptions,
        dataset={
            "num_shards": len(data.counts),
            "num_samples": int(data.counts.sum()),
            "bytes": int(data.nbytes.sum()),
            "bytes_per_sample": bytes_per_sample,
            "mean_shard_bytes": float(data.nbytes.mean()),
            "store": data.store,
            "sources": data.names,
        },
        world_size=world,
        samples_per_epoch=samples_per_epoch,
        time_to_first_batch_s=ttfb,
        samples_per_s=rates[slowest],
        input_bound=bounds[slowest] != "step",
        bound_by=bounds[slowest],
        samples_per_s_per_epoch=rates,
        bound_by_per_epoch=bounds,
        epoch_time_s=epoch_time_s,
        job_time_s=ttfb + sum(epoch_time_s),
        egress_bytes_per_epoch=egress,
        egress_detail=egress_detail,
        requests_per_epoch=requests,
        requests_detail=detail,
        cache_hit_rate=hit_rate,
        min_cache_bytes_per_node=min_cache,
        min_cache_note=min_note,
        cost_per_epoch=costs,
        recommendations=[],
        timings={
            "steps": steps,
            "first_batch": ttfb_parts,
            "epochs": times,
            "start_up": starts,
            "cache": [
                {"epoch": e, "hit_rate": hit_rate[e], **(cache_held[e] or {"held_mean": 0.0, "held_max": 0})}
                for e in range(len(per_epoch))
            ],
        },
        byte_ranges="exact" if exact else "proportional",
        probe=probed,
    )
    job.recommendations = _recommend(job, data, a, fetch, lat, bw_stream, bw_node, cpu_s, pace, per_epoch)
    job.warnings = _batch_warnings(
        _epoch_total(data, schedule),
        world,
        a["batch_size"],
        drop_last=a["drop_last"],
        mixture=data.sources is not None,
    )
    job.notes = [f"warning: {w}" for w in job.warnings] + _notes(data, a, job)
    job.compute_s = time.perf_counter() - began
    return job


def _epoch_total(data: _Data, schedule: Any) -> int:
    if data.sources is None:
        return int(data.counts.sum())
    return int(sum(schedule.per_epoch))


def _simulate_cache(per_epoch: list[dict[str, Any]], nodes: int, cap: int, num_shards: int) -> list[np.ndarray]:
    """The outcome of each access per epoch (0 hit, 1 fill, 2 read past the cache): each
    node's LRU cache of ``cap`` bytes over its accesses in time order (module doc). An epoch's
    accesses are its table accesses (``x["table_runs"]``: runs whose table the process does
    not hold, key ``num_shards + shard``) then its runs' shard accesses; a run's table is
    asked for just before its shard. Records the bytes each node holds at the end of each
    epoch in ``per_epoch[e]["held"]``."""

    def parts(x: dict[str, Any], e: int) -> dict[str, np.ndarray]:
        ep, runs = x["ep"], x["table_runs"]
        # a shard's entry is pinned while its lane reads the run: until the lane's next run starts
        lanes = ep.r_lanes[ep.reader]
        lane = ep.reader * (int(ep.r_lanes.max()) if len(ep.r_lanes) else 1) + ep.idx % lanes
        perm = np.lexsort((ep.idx, lane))
        until = np.ones(len(ep.shard))
        same = lane[perm][1:] == lane[perm][:-1]
        until[perm[:-1][same]] = x["t"][perm[1:][same]]
        return {
            "node": np.concatenate([x["node"][runs], x["node"]]),
            "t": np.concatenate([x["t"][runs], x["t"]]) + e,
            "until": np.concatenate([x["t"][runs], until]) + e,
            "sub": np.concatenate([np.zeros(len(runs), np.int8), np.ones(len(ep.shard), np.int8)]),
            "reader": np.concatenate([ep.reader[runs], ep.reader]),
            "key": np.concatenate([ep.shard[runs] + num_shards, ep.shard]),
            "size": np.concatenate([x["table_size"][runs], x["size"]]),
            "epoch": np.full(len(runs) + len(ep.shard), e, np.int64),
        }

    each = [parts(x, e) for e, x in enumerate(per_epoch)]
    lengths = [len(p["key"]) for p in each]
    if not cap:
        for x in per_epoch:
            x["held"] = {"held_mean": 0.0, "held_max": 0}
        return [np.full(n, 2, np.int8) for n in lengths]
    epochs = len(per_epoch)
    node, t, sub, reader, key, size, epoch_of, until = (
        np.concatenate([p[k] for p in each]) for k in ("node", "t", "sub", "reader", "key", "size", "epoch", "until")
    )
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
        k_list, z_list, n_list, e_list, t_list, u_list = (
            key[order].tolist(),
            size[order].tolist(),
            node[order].tolist(),
            epoch_of[order].tolist(),
            t[order].tolist(),
            until[order].tolist(),
        )
        result = [2] * len(order)
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
        out[order] = np.asarray(result, np.int8)
    outcomes = []
    at = 0
    for e, (x, n) in enumerate(zip(per_epoch, lengths)):
        outcomes.append(out[at : at + n])
        x["held"] = {"held_mean": float(held[e].mean()), "held_max": int(held[e].max())}
        at += n
    return outcomes


def _min_cache(data: _Data, per_epoch: list[dict[str, Any]], a: dict[str, Any], nodes: int) -> tuple[int, str]:
    """The node cache at which epochs after the first read nothing from the store."""
    varies = data.sources is not None and any(
        src.samples is not None or src.weight is not None or (src.repeat or 1.0) % 1 for src in data.sources
    )
    if (a["shard_affinity"] == "node" or nodes == 1) and not varies:
        x = per_epoch[0]  # the shards each node reads (the same every epoch)
        uniq = _unique(x["node"] * len(data.counts) + x["ep"].shard)
        shards = uniq % len(data.counts)
        per_node = np.bincount(uniq // len(data.counts), weights=data.nbytes[shards], minlength=nodes)
        need = int(per_node.max()) if len(per_node) else 0
    if a["shard_affinity"] == "node" and not varies:
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


class _Lanes:
    """The lanes of worker 0 of rank 0 in one epoch, and its node's GETs in flight, for the
    start-up terms (module doc, "Start-up")."""

    def __init__(
        self, x: dict[str, Any], data: _Data, lat: float, bw_node: float, bw_stream: float, fetches: _Fetches
    ) -> None:
        ep = x["ep"]
        self.lat, self.bw_node, self.bw_stream = lat, bw_node, bw_stream
        mine = np.flatnonzero(ep.r_proc == 0)  # the readers of rank 0's worker 0 (a mixture: one a source)
        node0 = ep.r_node == (ep.r_node[mine[0]] if len(mine) else 0)
        self.gets_node = float(ep.r_inflight[node0].sum()) or 1.0  # GETs in flight, every lane open
        runs_of = np.bincount(ep.reader, minlength=len(ep.r_part))
        samples_of = np.bincount(ep.reader, weights=x["count"], minlength=len(ep.r_part))
        bytes_of = np.bincount(ep.reader, weights=x["read_bytes"], minlength=len(ep.r_part))
        total = max(1.0, float(samples_of[mine].sum()))
        self.readers = [
            {
                "lanes": int(ep.r_lanes[r]),
                "part": int(ep.r_part[r]),
                "gets": max(1.0, float(ep.r_inflight[r]) / max(1, int(ep.r_lanes[r]))),  # per lane
                "share": float(samples_of[r]) / total,
                "bytes_per_sample": float(bytes_of[r]) / max(1.0, float(samples_of[r])),
                "runs": int(runs_of[r]),
                "shards_per_lane": max(1, fetches.worker.max_inflight_shards // max(1, int(ep.r_lanes[r]))),
            }
            for r in mine.tolist()
        ]
        self.lanes = sum(r["lanes"] for r in self.readers) or 1
        self.table = float(np.mean(x["table_size"])) if len(x["table_size"]) else 0.0

    def _get_rate(self, open_lanes: float) -> float:
        """One GET's bytes/s with ``open_lanes`` of the worker's lanes open on every worker."""
        gets = self.gets_node * open_lanes / self.lanes
        return min(self.bw_stream, self.bw_node / max(gets, 1.0))

    def open_s(self) -> float:
        """Until the worker's last lane has sent its first GET: lanes open one after another
        (each when the worker first draws from it), each a table GET, then its first ramp part
        (``part / 16``), at one GET's share of the node with ``k`` lanes of every worker open."""
        part = max((r["part"] for r in self.readers), default=0)
        first = max(1, part // 16)
        t = 2 * self.lat  # the last lane's table GET and first part GET
        for k in range(1, self.lanes):
            t += 2 * self.lat + (self.table + first) / self._get_rate(k)
        return t

    def fill_s(self, arrivals: float) -> float:
        """The last lane's bytes before the first batch: ``arrivals x share / lanes`` samples,
        in its ramping GETs (``part / 16`` doubling) to the one covering them, plus what the
        GETs alongside it have read by then (each ~half the covering GET), at its share of the
        node; plus a latency per round of GETs after the first."""
        worst = 0.0
        for r in self.readers:
            need = arrivals * r["share"] / max(1, r["lanes"]) * r["bytes_per_sample"]
            size, done, n = max(1, r["part"] // 16), 0.0, 0
            while True:
                done += size
                n += 1
                if done >= need:
                    break
                size = min(size * 2, r["part"])
            moved = done + (r["gets"] - 1) * size / 2
            rate = r["gets"] * self._get_rate(self.lanes)
            worst = max(worst, moved / rate + (math.ceil(n / r["gets"]) - 1) * self.lat)
        return worst

    def turns_s(self) -> float:
        """A lane that reads one shard at a time (``max_inflight_shards // lanes`` = 1) sends
        its next shard's first GET when the shard before is read: a latency without bytes per
        run after its first, which the worker waits for (its lanes are drawn in a fixed
        interleave); its busiest lane's."""
        worst = 0.0
        for r in self.readers:
            if r["shards_per_lane"] == 1:
                worst = max(worst, (math.ceil(r["runs"] / max(1, r["lanes"])) - 1) * self.lat)
        return worst


def _arrivals(a: dict[str, Any]) -> int:
    """Samples one worker's lanes deliver before its first batch leaves its shuffle buffer."""
    b = a["batch_size"]
    cap = a["shuffle_buffer"] if a["shuffle"] else 0
    if cap > 1:
        ramp = ramp_samples(cap)
        grow = max(0, cap - ramp)
        return ramp + 2 * min(b - 1, grow) + max(0, b - 1 - grow)
    return b


def _first_batch(
    x: dict[str, Any],
    data: _Data,
    a: dict[str, Any],
    fetches: _Fetches,
    *,
    lat: float,
    bw_stream: float,
    bw_node: float,
    cpu_s: float,
    open_s: float,
    t_worker: float,
) -> tuple[float, dict[str, float]]:
    """``time_to_first_batch_s`` and its parts (module doc)."""
    arrivals = _arrivals(a)
    lanes = _Lanes(x, data, lat, bw_node, bw_stream, fetches)
    parts = {
        "open_s": open_s,
        "workers_s": t_worker,
        "lanes_s": lanes.open_s(),
        "fill_s": lanes.fill_s(arrivals),
        "cpu_s": arrivals * cpu_s,
        "arrivals": float(arrivals),
    }
    data_s = parts["lanes_s"] + parts["fill_s"]
    return open_s + t_worker + max(data_s, parts["cpu_s"]), parts


def _step_timings(
    ttfb: float, input_rate_per_rank: float, pace: float | None, batch: int, world: int, per_rank: int
) -> list[dict[str, float]]:
    """The first steps: batch ``k`` of a rank is ready at ``ttfb + (k - 1) B / input rate``,
    its step starts when it is ready and the step before ended, and lasts ``B / pace``."""
    out, done = [], 0.0
    step_s = batch / pace if pace else 0.0
    for k in range(1, min(_STEPS_TIMED, max(1, -(-per_rank // batch))) + 1):
        ready = ttfb + (k - 1) * batch / max(input_rate_per_rank, 1e-12)
        end = max(ready, done) + step_s
        out.append({"step": k, "time_s": end, "samples_per_s": world * batch / max(end - done, 1e-12)})
        done = end
    return out


def _figures(store: str, a: dict[str, Any], probed: dict[str, Any] | None, index_bytes: int) -> tuple[dict, list]:
    defaults = STORE_DEFAULTS[store]
    probed = probed or {}
    figures, assumptions = {}, []
    table: dict[str, Any] = {**defaults, "cpu_s_per_sample": DEFAULT_CPU_S_PER_SAMPLE}
    table["cache_bandwidth_per_node"] = DEFAULT_CACHE_BANDWIDTH
    table["cpu_s_per_sample_cached"] = DEFAULT_CPU_S_PER_SAMPLE_CACHED
    table["client_s"] = 0.0 if store == "local" else DEFAULT_CLIENT_S
    table["worker_start_s"] = DEFAULT_WORKER_START_S
    table["open_s"] = None  # computed from the figures before it
    table["store_cpu_s_per_byte"] = 0.0
    for name, default in table.items():
        if name == "cpu_s_per_sample_cached" and default is not None:
            default = min(default, figures["cpu_s_per_sample"]["value"])
        if name == "open_s":
            lat_s = figures["latency_ms"]["value"] / 1e3
            default = figures["client_s"]["value"] + lat_s + index_bytes / figures["bandwidth_per_stream"]["value"]
        if a.get(name) is not None:
            figures[name] = {"value": float(a[name]), "source": "given"}
        elif probed.get(name) is not None:
            figures[name] = {"value": float(probed[name]), "source": "probed"}
        else:
            figures[name] = {"value": default, "source": "assumed"}
            if name in ("cache_bandwidth_per_node", "cpu_s_per_sample_cached") and not a["cache_bytes"]:
                continue
            if (name == "worker_start_s" and not a["workers"]) or name == "store_cpu_s_per_byte":
                continue
            assumptions.append({"name": name, "value": default, "why": _WHY[name] + f" [{store} default]"})
    if a["cores_per_node"] is not None:
        figures["cores_per_node"] = {"value": a["cores_per_node"], "source": "given"}
    elif probed:
        figures["cores_per_node"] = {"value": os.cpu_count() or 1, "source": "probed"}
    else:
        figures["cores_per_node"] = {"value": None, "source": "assumed"}
        assumptions.append({"name": "cores_per_node", "value": None, "why": _WHY["cores_per_node"]})
    return figures, assumptions


def _recommend(
    job: JobPlan,
    data: _Data,
    a: dict[str, Any],
    fetch: FetchConfig,
    lat: float,
    bw_stream: float,
    bw_node: float,
    cpu_s: float,
    pace: float | None,
    per_epoch: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Workers, read-ahead, shard size and cache size for this job (module doc)."""
    out = []
    gpn, world, workers = a["gpus_per_node"], job.world_size, max(1, a["workers"])
    per_sample = job.dataset["bytes_per_sample"]
    # workers: enough CPU for the pace (or for the node's bandwidth without one), 25% spare
    want = pace if pace else min(bw_node / per_sample / gpn, 1e9)
    need_workers = max(1, math.ceil(want * cpu_s * 1.25))
    out.append(
        {
            "setting": "workers",
            "value": need_workers,
            "reason": f"{want:,.0f} samples/s per rank at {_duration(cpu_s)} of reader CPU a sample, 25% "
            f"spare ({'the consumer pace' if pace else 'what the node link can bring'}); needs that many free "
            f"cores per GPU ({need_workers * gpn:,} per node)",
        }
    )
    # read-ahead: GETs in flight per worker for its share of the node link at this latency
    lanes = a["max_open_shards"] if a["shuffle"] else 1
    part = fetch.part_bytes
    per_worker = min(bw_node, (pace or math.inf) * gpn * per_sample) / (gpn * workers)
    in_flight = max(1, math.ceil(per_worker * (lat + part / bw_stream) / part))
    in_flight = max(in_flight, lanes)
    buffer = 2 * part * workers * max(lanes, in_flight)
    out.append(
        {
            "setting": "FetchConfig.max_inflight_requests",
            "value": max(fetch.max_inflight_requests, in_flight),
            "reason": f"{_rate(per_worker)} per worker at {_duration(lat)} latency and "
            f"{_rate(bw_stream)} a stream needs {in_flight:,} GETs of {_size(part)} in flight",
        }
    )
    out.append(
        {
            "setting": "FetchConfig.max_buffer_bytes",
            "value": max(fetch.max_buffer_bytes, buffer),
            "reason": f"a rank's {workers} workers x {max(lanes, in_flight)} parts x 2 keep part_bytes={_size(part)} "
            "whole per lane (share_read_ahead halves a smaller share down to 1 MiB GETs)",
        }
    )
    out.append(
        {
            "setting": "FetchConfig.max_inflight_shards",
            "value": max(fetch.max_inflight_shards, lanes + 1),
            "reason": f"one more than the {lanes} lanes a worker reads at once (max_open_shards), so the next "
            "shard's GETs start before a lane's shard ends",
        }
    )
    egress_rate = job.egress_bytes_per_epoch[-1] / max(job.epoch_time_s[-1], 1e-12)
    limit = job.figures["request_rate_limit"]["value"]
    if limit:
        want_part = egress_rate / (0.8 * limit)
        if want_part > part:
            out.append(
                {
                    "setting": "FetchConfig.part_bytes",
                    "value": 1 << math.ceil(math.log2(want_part)),
                    "reason": f"{_rate(egress_rate)} in GETs of {_size(part)} is over 80% of the store's "
                    f"{limit:,.0f} GETs/s",
                }
            )
    # shard size: big enough that a shard is many GETs' worth (tables, ramps and cuts are
    # small), small enough that every worker has several shards per lane each epoch
    total = job.dataset["bytes"]
    small = 4 * part
    large = total / max(1, world * workers * 4 * lanes)
    mean = job.dataset["mean_shard_bytes"]
    if large >= small:
        value = f"{_size(small)} - {_size(large)}"
        fine = small <= mean <= large
        reason = (
            f"now {_size(mean)}: "
            + ("within" if fine else "outside")
            + f" the range: >= 4 x part_bytes ({_size(part)}) per shard keeps tables and ramps small; <= dataset "
            f"/ ({world:,} ranks x {workers} workers x 4 shards x {lanes} lanes) gives each lane several shards"
        )
    else:
        value = _size(small)
        reason = (
            f"now {_size(mean)}: the dataset is too small for every worker's lanes to get several shards of "
            f">= 4 x part_bytes; prefer fewer, larger GETs (shards of {_size(small)}) or fewer workers"
        )
    out.append({"setting": "shard size (pack --shard-size)", "value": value, "reason": reason})
    cap = a["cache_bytes"]
    need = job.min_cache_bytes_per_node
    if cap < need:
        reason = (
            f"a cache of {_size(need)} per node reads nothing from the store after the first epoch"
            if a["shard_affinity"] == "node" or (a["nodes"] == 1 and data.sources is None)
            else f"{job.min_cache_note}"
        )
        if a["shard_affinity"] is None and a["nodes"] > 1:
            reason += (
                f"; with shard_affinity='node' a node needs only its share, "
                f"~{_size(total / a['nodes'])}, to read nothing after the first epoch"
            )
        out.append({"setting": "cache_bytes (per node)", "value": need, "reason": reason})
    return out


def _batch_warnings(total: int, world: int, batch: int, *, drop_last: bool, mixture: bool) -> list[str]:
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


def _notes(data: _Data, a: dict[str, Any], job: JobPlan) -> list[str]:
    notes = []
    if data.store == "local":
        notes.append(
            "a local dataset: requests, egress and the node cache are what the same dataset would see in a remote "
            "store (locally its files are read in place, with no requests and no cache)"
        )
    if job.byte_ranges != "exact":
        notes.append("bytes of shards cut at rank/worker/node boundaries are proportional to their samples")
    if a["cache_bytes"]:
        notes.append(
            "the node cache is simulated per node as LRU of whole shards and tables; entries being read are "
            "pinned, and a fill that finds no unpinned room bypasses the cache (reads its range only)"
        )
        open_bytes = a["gpus_per_node"] * max(1, a["workers"]) * (a["max_open_shards"] + 1) * float(data.nbytes.mean())
        if a["cache_bytes"] < 4 * open_bytes:
            notes.append(
                f"cache_bytes is under 4x what a node's readers hold open ({_size(open_bytes)}): which fills bypass "
                "it depends on the order in which lanes that start together reach it, which varies run to run; "
                "expect egress and requests to vary by a few shards"
            )
    if job.cost_per_epoch is not None and (a["price_per_gb"] is None or a["price_per_1000_gets"] is None):
        notes.append("cost: the price not given counts as 0")
    return notes


# ----------------------------------------------------------------------------------------------
# small helpers


def _unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` by a sort (numpy 2.4's hashing unique is ~100x slower on 10^6 int64)."""
    s = np.sort(values)
    return s[np.concatenate([[True], s[1:] != s[:-1]])] if len(s) else s


def _plain(value: Any) -> Any:
    """``value`` with numpy numbers, tuples and dataclasses made JSON-ready."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _echo(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _size(n: float) -> str:
    """Bytes at a human scale: ``"512 B"``, ``"16.8 MB"``, ``"1.0 PB"`` (powers of 1,000)."""
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


_SIZE_UNITS = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1.0, "B"))
_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))


def _sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits in plain notation, never scientific, with
    thousands separators and at least one decimal under 10: ``"2.0"``, ``"1.25"``, ``"50"``,
    ``"1,500"``, ``"0.000012"`` (two digits)."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    x = float(f"{x:.{digits}g}")
    places = max(0, min(15, digits - 1 - math.floor(math.log10(abs(x)))))
    text = f"{x:,.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + ".0" if abs(x) < 10 and "." not in text else text


def _scaled(x: float, units: tuple[tuple[float, str], ...], one: str) -> str:
    """``x`` in the largest of ``units`` (``(factor, name)``, largest first) it reaches, to 3
    significant digits; 0 in the unit ``one``."""
    if x == 0:
        return f"0 {one}"
    x = float(f"{x:.3g}")
    factor, name = next((unit for unit in units if abs(x) >= unit[0]), units[-1])
    return f"{_sig(x / factor)} {name}"


def _rate(bytes_per_s: float) -> str:
    """Bytes/s at a human scale: ``"2.0 GB/s"``, ``"100 MB/s"``."""
    return _scaled(bytes_per_s, _SIZE_UNITS, "B") + "/s"


def _duration(s: float) -> str:
    """Seconds at a human scale: ``"50 us"``, ``"100 ms"``, ``"5.55 s"``, ``"12.2 min"``, ``"16.6 h"``."""
    if s < 120:
        return _scaled(s, _TIME_UNITS, "s")
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _count(n: float) -> str:
    """A count with thousands separators (``"5,500"``); a fraction to 3 significant digits."""
    return f"{n:,.0f}" if float(n).is_integer() else _sig(n)


# What a figure of None means, where it means more than "none".
_NONE_MEANS = {"request_rate_limit": "none (unlimited)", "cores_per_node": "1 per worker"}


def _figure(name: str, value: float | None) -> str:
    """A figure of the table with its unit, read from its name (``latency_ms``, ``*_s``,
    ``*_s_per_sample``, ``*_s_per_byte``, ``bandwidth_*``, ``*_bytes``), at a human scale:
    ``"2.0 GB/s"``, ``"50 us"``, ``"5,500 GETs/s"``; never scientific notation."""
    if value is None:
        return _NONE_MEANS.get(name, "none")
    if name.endswith("_ms"):
        return _duration(value / 1e3)
    if "bandwidth" in name:
        return _rate(value)
    if name.endswith("_s_per_byte"):
        return _duration(value * 1e6) + "/MB"
    if "_s_per_sample" in name or name.endswith("_s"):
        return _duration(value)
    if name == "request_rate_limit":
        return f"{_count(value)} GETs/s"
    if name.endswith("_bytes"):
        return _size(value)
    return _count(value)


def _setting_value(setting: str, value: Any) -> str:
    """A recommendation's value for the table: bytes at a human scale with the exact count
    (``"268.4 MB (268,435,456 bytes)"``), counts with thousands separators, text as it is."""
    if isinstance(value, str) or isinstance(value, bool):
        return str(value)
    if "bytes" in setting:
        return f"{_size(value)} ({value:,} bytes)"
    return _count(value)
