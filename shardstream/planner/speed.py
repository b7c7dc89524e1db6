"""Each epoch's speed: the time each resource needs for it, and the one that bounds it.

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
- ``cpu``: ``t_worker + t_lanes + t_turns`` (the worker waits, its CPU idle; :mod:`.lanes`)
  plus the larger of the busiest worker's CPU, ``samples read from the store x
  cpu_s_per_sample + cache hits' samples x cpu_s_per_sample_cached``, and the busiest node's
  CPU over its ``cores_per_node``: its workers' CPU + ``store_cpu_s_per_byte`` x its egress (a
  store or proxy on the node, such as a local test server: 0 for a remote store). ``cpu_bw =
  cores / (cpu_s_per_sample / bytes per sample + store_cpu_s_per_byte)`` is the bytes/s those
  cores can take in (unlimited without ``cores_per_node``);
- ``cache``: the busiest node's bytes read from its cache / ``cache_bandwidth_per_node``.

``samples_per_s`` is the whole job's rate in the slowest epoch (``world_size x per_rank /
epoch time``, the epoch's start-up included), ``bound_by`` what bounds that epoch,
``input_bound`` whether it is anything but the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .figures import Figures
from .lanes import Lanes
from .report import BOUNDS
from .requests import EpochReads, Traffic
from .runs import Fetches
from .settings import PlanSettings

__all__ = ["EpochSpeed", "epoch_speed"]


@dataclass
class EpochSpeed:
    """One epoch's speed (module doc).

    Attributes:
        times: seconds each resource needs for the epoch, by bound.
        start_up: the epoch's start-up terms (``workers_s``, ``lanes_s``, ``shard_turns_s``).
        rate: the whole job's samples/s.
        bound: what bounds it (one of :data:`~.report.BOUNDS`).
    """

    times: dict[str, float]
    start_up: dict[str, float]
    rate: float
    bound: str


def epoch_speed(
    e: int,
    x: EpochReads,
    sent: Traffic,
    s: PlanSettings,
    f: Figures,
    fetches: Fetches,
    samples_per_epoch: int,
) -> EpochSpeed:
    """Epoch ``e``'s speed (module doc): its reads ``x``, what they ``sent`` to the store."""
    nodes, gpn, world, workers = s.nodes, s.gpus_per_node, s.world_size, s.processes
    ep = x.ep
    moved, hit = sent.moved, sent.hit
    node_egress = np.bincount(x.node, weights=moved, minlength=nodes)
    node_hits = np.bincount(x.node, weights=np.where(hit, x.read_bytes, 0), minlength=nodes)
    reader_egress = np.bincount(ep.reader, weights=moved, minlength=len(ep.r_part))
    proc_egress = np.bincount(ep.r_proc, weights=reader_egress, minlength=world * workers)
    worker_rate = _worker_rate(x, s, f)
    node_bw = min(f.bandwidth_per_node, gpn * workers * worker_rate)
    # the epoch's start-up (lanes.py, "Start-up"): workers (re)started, their lanes opened
    requests = sum(sent.requests_detail.values())
    remote = requests > 0
    restart = e == 0 or not s.persistent
    t_worker = (f.worker_start_s + (f.client_s if remote else 0.0)) if restart and s.workers else 0.0
    link = min(f.bandwidth_per_node, f.cpu_bandwidth) if remote else f.cache_bandwidth_per_node
    lanes = Lanes(x, f.latency_s if remote else 0.0, link, f.bandwidth_per_stream, fetches)
    t_open = lanes.open_s()
    t_turns = lanes.turns_s() if remote else 0.0
    start_up = {"workers_s": t_worker, "lanes_s": t_open, "shard_turns_s": t_turns}
    proc_cpu, node_cpu = _cpu(x, hit, node_egress, s, f)
    network = 0.0  # where the epoch reads nothing from the store
    if node_egress.max() > 0:  # the link idles until the first GETs
        network = t_worker + 2 * f.latency_s + float(max(node_egress.max() / node_bw, proc_egress.max() / worker_rate))
    cpu = float(max(proc_cpu.max(), node_cpu.max() / (f.cores_per_node or math.inf)))
    pace = s.pace
    t: dict[str, float] = {
        "network": network,
        "requests": requests / f.request_rate_limit if f.request_rate_limit else 0.0,
        "cpu": t_worker + t_open + t_turns + cpu,
        "cache": float(node_hits.max()) / f.cache_bandwidth_per_node if s.cache_bytes else 0.0,
        "step": samples_per_epoch / world / pace if pace else 0.0,
    }
    bound = max(BOUNDS, key=lambda k: t[k])
    epoch_time = max(t[bound], 1e-12)
    return EpochSpeed({k: float(v) for k, v in t.items()}, start_up, samples_per_epoch / epoch_time, bound)


def _worker_rate(x: EpochReads, s: PlanSettings, f: Figures) -> float:
    """A worker's bytes/s from the store: its GETs in flight x ``p / (latency + p /
    bandwidth_per_stream)`` (typical worker, typical part; module doc, ``network``)."""
    ep, procs = x.ep, s.world_size * s.processes
    part_typ = float(np.median(ep.r_part)) if len(ep.r_part) else s.fetch.part_bytes
    inflight = np.bincount(ep.r_proc, weights=ep.r_inflight, minlength=procs)
    inflight_typ = float(np.median(inflight)) if len(inflight) else 1.0
    return inflight_typ * part_typ / (f.latency_s + part_typ / f.bandwidth_per_stream)


def _cpu(
    x: EpochReads, hit: np.ndarray, node_egress: np.ndarray, s: PlanSettings, f: Figures
) -> tuple[np.ndarray, np.ndarray]:
    """Each reading process's CPU seconds for the epoch, and each node's (its processes' and
    its store's for ``node_egress`` bytes); module doc, ``cpu``."""
    ep, procs = x.ep, s.world_size * s.processes
    proc_samples = np.bincount(ep.r_proc[ep.reader], weights=x.count, minlength=procs)
    proc_hit_samples = np.bincount(ep.r_proc[ep.reader], weights=np.where(hit, x.count, 0), minlength=procs)
    proc_cpu = (proc_samples - proc_hit_samples) * f.cpu_s_per_sample + proc_hit_samples * f.cpu_s_per_sample_cached
    proc_node = np.arange(procs) // (s.gpus_per_node * s.processes)
    node_cpu = np.bincount(proc_node, weights=proc_cpu, minlength=s.nodes) + f.store_cpu_s_per_byte * node_egress
    return proc_cpu, node_cpu
