"""The public entry points, :func:`plan` and :func:`plan_counts`, and :func:`build`, which runs
the model (the doc of :mod:`shardstream.planner.model`) on a dataset's shards for one job's
settings: the runs of each epoch, their requests, the node caches, the speed, the start-up, and
the advice, into one :class:`~.report.JobPlan`."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import FetchConfig, S3Config
from ..reading.mixture import Source
from ..reading.plan import per_rank as rank_share
from .advice import batch_warnings, notes, recommend
from .cache import min_cache, simulate_cache
from .figures import STORE_DEFAULTS, Figures, figures_of
from .lanes import first_batch, step_timings
from .opening import Data, open_data, time_open
from .report import JobPlan, echo
from .requests import EpochReads, Traffic, epoch_reads, traffic
from .runs import Fetches, Ranges, epoch_total, exact_ranges, schedule_of
from .settings import PlanSettings
from .speed import EpochSpeed, epoch_speed

__all__ = ["build", "plan", "plan_counts"]


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
    """Predict a training job's data loading from its dataset's index (the doc of
    :mod:`shardstream.planner.model`).

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
        the :class:`~.report.JobPlan`.

    Raises:
        ValueError: an argument out of range (named, with what to pass), a mixture with
            ``shard_affinity``, or a dataset without an index.
        ShardNotFoundError, IndexFormatError: as :func:`~shardstream.open_index`.
    """
    settings = PlanSettings.of(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        workers=workers,
        batch_size=batch_size,
        step_time_s=step_time_s,
        samples_per_s_per_gpu=samples_per_s_per_gpu,
        cache_bytes=cache_bytes,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        max_open_shards=max_open_shards,
        drop_last=drop_last,
        shard_affinity=shard_affinity,
        epochs=epochs,
        latency_ms=latency_ms,
        bandwidth_per_node=bandwidth_per_node,
        request_rate_limit=request_rate_limit,
        price_per_gb=price_per_gb,
        price_per_1000_gets=price_per_1000_gets,
        cpu_s_per_sample=cpu_s_per_sample,
        probe=probe,
        s3=s3,
        fetch=fetch,
        bandwidth_per_stream=bandwidth_per_stream,
        cache_bandwidth_per_node=cache_bandwidth_per_node,
        persistent_workers=persistent_workers,
        epoch_samples=epoch_samples,
        mix=mix,
        decode=decode,
        cpu_s_per_sample_cached=cpu_s_per_sample_cached,
        open_s=open_s,
        client_s=client_s,
        worker_start_s=worker_start_s,
        cores_per_node=cores_per_node,
    )
    return _plan_location(dataset, settings)


def _plan_location(dataset: str | os.PathLike[str] | Sequence[Source], s: PlanSettings) -> JobPlan:
    """:func:`plan` of ``dataset``, its settings made: the dataset opened, probed where asked.

    Raises:
        as :func:`plan`.
    """
    store = s.store
    opened = None
    if s.probe:  # timed first: this process's first store access
        opened = time_open(dataset, s3=store.s3, fetch=store.fetch, epoch_samples=s.epoch_samples, mix=s.mix)
    data = open_data(dataset, s3=store.s3, epoch_samples=s.epoch_samples, mix=s.mix, shard_affinity=s.shard_affinity)
    probed = None
    if s.probe:
        from .probe import probe as run_probe

        probed = run_probe(data.location_for_probe, s3=store.s3, fetch=store.fetch, decode=s.decode)
        probed["open_s"] = opened if opened is not None else data.open_s
    return build(data, s, probed)


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
    settings = PlanSettings.of(**kwargs)
    data = Data(
        counts=counts,
        nbytes=nbytes,
        members=members,
        source_starts=[0, len(counts)],
        names=["arrays"],
        store=store,
        index_bytes=[51 * len(counts) + 416],
    )
    return build(data, settings, None)


def build(data: Data, s: PlanSettings, probed: dict[str, Any] | None) -> JobPlan:
    """The plan of the job ``s`` on ``data`` (the doc of :mod:`shardstream.planner.model`);
    ``probed``: the probe's figures (None: not probed)."""
    began = time.perf_counter()
    world = s.world_size
    figures, assumptions = figures_of(data.store, s, probed, max(data.index_bytes))
    f = Figures.of(figures, s, data)
    schedule = schedule_of(data, s)
    fetches = Fetches(s.fetch, s.workers)
    exact = exact_ranges(data, s)
    # per epoch, per run: what a cache hit, a fill and a plain read would cost
    per_epoch = epoch_reads(data, s, schedule, fetches, Ranges(data, exact))
    outcome = simulate_cache(per_epoch, s.nodes, s.cache_bytes, len(data.counts))  # 0 hit, 1 fill, 2 read past
    total = epoch_total(data, schedule)
    samples_per_epoch = world * rank_share(total, world, drop_last=s.order.drop_last)
    sent = [traffic(x, got, e == 0, data, s) for e, (x, got) in enumerate(zip(per_epoch, outcome))]
    speeds = [
        epoch_speed(e, x, out, s, f, fetches, samples_per_epoch) for e, (x, out) in enumerate(zip(per_epoch, sent))
    ]
    ttfb, ttfb_parts = first_batch(
        per_epoch[0],
        s,
        fetches,
        lat=f.latency_s,
        bw_stream=f.bandwidth_per_stream,
        bw_node=min(f.bandwidth_per_node, f.cpu_bandwidth),
        cpu_s=f.cpu_s_per_sample * f.contention,
        open_s=f.open_s,
        t_worker=speeds[0].start_up["workers_s"],
    )
    job = JobPlan(
        inputs={k: echo(v) for k, v in s.inputs().items()} | {"dataset": data.names},
        figures=figures,
        assumptions=assumptions,
        dataset=_dataset(data),
        world_size=world,
        samples_per_epoch=samples_per_epoch,
        time_to_first_batch_s=ttfb,
        byte_ranges="exact" if exact else "proportional",
        probe=probed,
        **_epochs(data, s, per_epoch, sent, speeds, ttfb, ttfb_parts, samples_per_epoch),
    )
    job.recommendations = recommend(job, data, s, f)
    job.warnings = batch_warnings(
        total, world, s.batch_size, drop_last=s.order.drop_last, mixture=data.sources is not None
    )
    job.notes = [f"warning: {w}" for w in job.warnings] + notes(data, s, job)
    job.compute_s = time.perf_counter() - began
    return job


def _dataset(data: Data) -> dict[str, Any]:
    """``JobPlan.dataset``: the shards, samples and bytes, and the store."""
    return {
        "num_shards": len(data.counts),
        "num_samples": int(data.counts.sum()),
        "bytes": int(data.nbytes.sum()),
        "bytes_per_sample": data.bytes_per_sample,
        "mean_shard_bytes": float(data.nbytes.mean()),
        "store": data.store,
        "sources": data.names,
    }


def _epochs(
    data: Data,
    s: PlanSettings,
    per_epoch: list[EpochReads],
    sent: list[Traffic],
    speeds: list[EpochSpeed],
    ttfb: float,
    ttfb_parts: dict[str, float],
    samples_per_epoch: int,
) -> dict[str, Any]:
    """The :class:`~.report.JobPlan` attributes of the epochs: speed, egress, requests, the
    node caches, costs and timings (the first steps from ``ttfb``)."""
    world = s.world_size
    rates = [sp.rate for sp in speeds]
    times = [sp.times for sp in speeds]
    slowest = int(np.argmin(rates))
    epoch_time_s = [max(t.values()) for t in times]
    requests = [sum(out.requests_detail.values()) for out in sent]
    hit_rate = [out.hit_rate for out in sent]
    costs = None
    if s.price_per_gb is not None or s.price_per_1000_gets is not None:
        gb, gets_price = s.price_per_gb or 0.0, s.price_per_1000_gets or 0.0
        costs = [sum(out.egress_detail.values()) / 1e9 * gb + rq / 1000 * gets_price for out, rq in zip(sent, requests)]
    first_input_rate = samples_per_epoch / max(max(v for k, v in times[0].items() if k != "step"), 1e-12)
    min_bytes, min_note = min_cache(data, per_epoch, s)
    return {
        "samples_per_s": rates[slowest],
        "input_bound": speeds[slowest].bound != "step",
        "bound_by": speeds[slowest].bound,
        "samples_per_s_per_epoch": rates,
        "bound_by_per_epoch": [sp.bound for sp in speeds],
        "epoch_time_s": epoch_time_s,
        "job_time_s": ttfb + sum(epoch_time_s),
        "egress_bytes_per_epoch": [out.egress_detail["data"] for out in sent],
        "egress_detail": [out.egress_detail for out in sent],
        "requests_per_epoch": requests,
        "requests_detail": [out.requests_detail for out in sent],
        "cache_hit_rate": hit_rate,
        "min_cache_bytes_per_node": min_bytes,
        "min_cache_note": min_note,
        "cost_per_epoch": costs,
        "recommendations": [],
        "timings": {
            "steps": step_timings(
                ttfb, first_input_rate / world, s.pace, s.batch_size, world, samples_per_epoch // world
            ),
            "first_batch": ttfb_parts,
            "epochs": times,
            "start_up": [sp.start_up for sp in speeds],
            "cache": [
                {"epoch": e, "hit_rate": hit_rate[e], **(x.held or {"held_mean": 0.0, "held_max": 0})}
                for e, x in enumerate(per_epoch)
            ],
        },
    }
