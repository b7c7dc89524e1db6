"""Start-up: what a worker waits for before its lanes read at pace (each epoch), the time to
the first batch (the first epoch), and the first steps.

Start-up (each epoch)
---------------------
Inputs: ``open_s``, ``client_s``, ``worker_start_s`` (given, probed, or defaults: a remote
store's client 0.1 s, a worker 0.05 s, ``open_s = client_s + latency + index bytes /
bandwidth_per_stream``). ``link`` below is the node's bandwidth as the start sees it,
``min(bandwidth_per_node, cpu_bw)`` (``cpu_bw``: :mod:`.speed`); ``G`` the node's GETs in
flight with every lane open, ``L`` a worker's lanes (all its sources'), ``g`` a lane's GETs in
flight (its share of ``max_inflight_requests``), ``p`` its ``part_bytes``; all of worker 0 of
rank 0.

- ``t_worker``: each epoch without ``persistent_workers`` (and the first), DataLoader workers
  start: ``worker_start_s``, plus ``client_s`` where the epoch sends any request (a worker
  makes its store client on its first remote read; an epoch of cache hits only makes none).
  0 with ``workers=0``.
- ``t_lanes``: a worker's lanes open one after another (each when the worker first draws a
  sample from it; their interleave is fixed): lane ``k`` costs its table GET and its first
  ramping part, ``2 latency + (table + p/64) / r(k)``, with ``r(k) = min(bandwidth_per_stream,
  link / (G k / L))`` one GET's share while ``k`` lanes of every worker read; the last lane
  only its two latencies. An epoch of cache hits only: no latency, ``link`` the cache disk.
- ``t_turns``: a lane that reads one shard at a time (``max_inflight_shards // lanes`` = 1)
  sends its next shard's first GET once the shard before is read: a latency without bytes per
  run after its first, which the worker waits for (the interleave is fixed): ``latency x
  (ceil(runs / lanes) - 1)``, its busiest reader's.

The first batch
---------------
``time_to_first_batch_s`` = ``open_s + t_worker + max(t_lanes + t_fill, t_cpu)`` (first
epoch), where ``t_cpu = a x cpu_s_per_sample x max(1, node workers / cores_per_node)`` and
``t_fill`` is the last lane's wait: it needs ``a x share / lanes`` samples (``share``: its
source's part of the worker's samples) at that source's bytes per sample, read by its ramping
GETs (``p/64``, doubling to ``p``) up to the one that covers them (``m`` GETs, ``C`` bytes,
the last of size ``s``) while the ``g - 1`` GETs beside it have read ~``s/2`` each: ``t_fill =
(C + (g - 1) s / 2) / (g x r(L)) + (ceil(m / g) - 1) x latency``, the largest over the
worker's sources. ``a``, the arrivals one worker needs before its first batch leaves its
shuffle buffer: ``ramp + 2 min(B - 1, capacity - ramp) + max(0, B - 1 - (capacity - ramp))``
for a batch of ``B`` (``ramp = ramp_samples(shuffle_buffer)``; without shuffle ``a = B``).
Process start-up (imports) is not counted. The parts are in ``timings["first_batch"]``, each
epoch's start-up terms in ``timings["start_up"]``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..reading.plan import ramp_samples
from .requests import EpochReads, ramp_sizes
from .runs import Fetches
from .settings import PlanSettings

__all__ = ["Lanes", "arrivals", "first_batch", "step_timings"]

_STEPS_TIMED = 100  # steps in JobPlan.timings["steps"]


class Lanes:
    """The lanes of worker 0 of rank 0 in one epoch, and its node's GETs in flight, for the
    start-up terms (module doc, "Start-up")."""

    def __init__(self, x: EpochReads, lat: float, bw_node: float, bw_stream: float, fetches: Fetches) -> None:
        ep = x.ep
        self.lat, self.bw_node, self.bw_stream = lat, bw_node, bw_stream
        mine = np.flatnonzero(ep.r_proc == 0)  # the readers of rank 0's worker 0 (a mixture: one a source)
        node0 = ep.r_node == (ep.r_node[mine[0]] if len(mine) else 0)
        self.gets_node = float(ep.r_inflight[node0].sum()) or 1.0  # GETs in flight, every lane open
        runs_of = np.bincount(ep.reader, minlength=len(ep.r_part))
        samples_of = np.bincount(ep.reader, weights=x.count, minlength=len(ep.r_part))
        bytes_of = np.bincount(ep.reader, weights=x.read_bytes, minlength=len(ep.r_part))
        total = max(1.0, float(samples_of[mine].sum()))
        self.readers = [
            {
                "lanes": int(ep.r_lanes[r]),
                "part": int(ep.r_part[r]),
                "gets": max(1.0, float(ep.r_inflight[r]) / max(1, int(ep.r_lanes[r]))),  # per lane
                "share": float(samples_of[r]) / total,
                "bytes_per_sample": float(bytes_of[r]) / max(1.0, float(samples_of[r])),
                "runs": int(runs_of[r]),
                "shards_per_lane": fetches.shards_per_lane(int(ep.r_lanes[r])),
            }
            for r in mine.tolist()
        ]
        self.lanes = sum(r["lanes"] for r in self.readers) or 1
        self.table = float(np.mean(x.table_size)) if len(x.table_size) else 0.0

    def _get_rate(self, open_lanes: float) -> float:
        """One GET's bytes/s with ``open_lanes`` of the worker's lanes open on every worker."""
        gets = self.gets_node * open_lanes / self.lanes
        return min(self.bw_stream, self.bw_node / max(gets, 1.0))

    def open_s(self) -> float:
        """Until the worker's last lane has sent its first GET: lanes open one after another
        (each when the worker first draws from it), each a table GET, then its first ramp part
        (``part / 64``), at one GET's share of the node with ``k`` lanes of every worker open."""
        part = max((r["part"] for r in self.readers), default=0)
        first = (ramp_sizes(part) or [max(1, part)])[0]
        t = 2 * self.lat  # the last lane's table GET and first part GET
        for k in range(1, self.lanes):
            t += 2 * self.lat + (self.table + first) / self._get_rate(k)
        return t

    def fill_s(self, arrivals: float) -> float:
        """The last lane's bytes before the first batch: ``arrivals x share / lanes`` samples,
        in its ramping GETs (``part / 64`` doubling) to the one covering them, plus what the
        GETs alongside it have read by then (each ~half the covering GET), at its share of the
        node; plus a latency per round of GETs after the first."""
        worst = 0.0
        for r in self.readers:
            need = arrivals * r["share"] / max(1, r["lanes"]) * r["bytes_per_sample"]
            done, n = 0.0, 0
            for size in itertools.chain(ramp_sizes(r["part"]), itertools.repeat(r["part"])):
                done += size
                n += 1
                if done >= need:
                    break
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


def arrivals(s: PlanSettings) -> int:
    """Samples one worker's lanes deliver before its first batch leaves its shuffle buffer."""
    b = s.batch_size
    cap = s.order.shuffle_buffer if s.order.shuffle else 0
    if cap > 1:
        ramp = ramp_samples(cap)
        grow = max(0, cap - ramp)
        return ramp + 2 * min(b - 1, grow) + max(0, b - 1 - grow)
    return b


def first_batch(
    x: EpochReads,
    s: PlanSettings,
    fetches: Fetches,
    *,
    lat: float,
    bw_stream: float,
    bw_node: float,
    cpu_s: float,
    open_s: float,
    t_worker: float,
) -> tuple[float, dict[str, float]]:
    """``time_to_first_batch_s`` and its parts (module doc), from the first epoch's reads ``x``."""
    wanted = arrivals(s)
    lanes = Lanes(x, lat, bw_node, bw_stream, fetches)
    parts = {
        "open_s": open_s,
        "workers_s": t_worker,
        "lanes_s": lanes.open_s(),
        "fill_s": lanes.fill_s(wanted),
        "cpu_s": wanted * cpu_s,
        "arrivals": float(wanted),
    }
    data_s = parts["lanes_s"] + parts["fill_s"]
    return open_s + t_worker + max(data_s, parts["cpu_s"]), parts


def step_timings(
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
