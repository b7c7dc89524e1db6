"""The job planner against real reads: ``shardstream.plan(...)``'s predictions next to what the
same job measures on this machine, scenario by scenario (issue 41, point 3).

Two datasets, written once by ``pack_samples`` (kept under ``--workdir`` between runs) and
uploaded to one local SeaweedFS server started here: ``big``, ``--samples`` (6,000) samples of
~``--sample-kb`` (80) KB (a ``bin`` member of random bytes, 0.8x-1.2x the size, and a ``cls``
label) in ``--shard-mib`` (24) MiB shards (20 shards, ~490 MB); ``small``, 1,000 samples of
~20 KB in 4 MiB shards (6 shards, ~22 MB), the second source of the mixture scenarios
(``Source(big)`` + ``Source(small)``, each read once an epoch).

Every read goes through a ``FaultProxy`` (tests/servers/faultproxy.py) in this process, in
front of the server, which imposes the store's figures and counts the traffic:
  - added latency: every request (each ranged GET on a kept-alive connection included) waits
    ``delay`` ms before it is forwarded;
  - a bandwidth cap: the answers' bodies to all clients together are paced at ``cap`` MB/s
    (one link: a lone answer gets ~93% of it here, the proxy sharing this process);
  - requests and response body bytes by kind, counted as each answer ends: ranged GETs,
    whole GETs, HEADs and LISTs (a GET with ``list-type`` or of a bare bucket), separately.
The job: ``procs`` separate Python processes (``RANK``/``WORLD_SIZE`` 0/2 and 1/2 for two: one
node, a GPU each, no torch.distributed), each a ``ShardDataset(shuffle=True, seed=0,
batch_size=64)`` (with a node cache ``cache_dir=`` of ``cache`` times the dataset's bytes,
shared by the processes, where the scenario has one) read by a ``DataLoader`` of 2 workers
and batches of 64; the batches carry their sample count only (nothing decoded; the training
step takes no time). The processes wait for each other (this script is the barrier) after
opening the dataset and after each epoch, so the proxy's counters are read per phase: the
open (the index, read when the dataset is made) and each epoch.

Measured, per scenario (the job, all processes together):
  - time to first batch: from dataset construction (``ShardDataset(...)``: the S3 client made,
    the index read) to the first batch of the first epoch out of the DataLoader (its workers
    started), the slowest process's: what the first training step waits for. Imports (torch,
    shardstream, aiobotocore) come before: process start-up, which the planner leaves out too.
    Printed beside it: the open and the iterator's share, and the bytes of the answers the
    proxy had finished by the first batch (a lower bound: parts still on the wire not counted);
  - samples/s: the epoch's samples over its wall time, from the earliest process's iterator
    creation to the last one's end (the planner's steady rate is samples per epoch over the
    epoch's time). The rate after the first batch (samples after it, from the earliest first
    batch to the end), as the issue first put it, is printed beside it: on epochs this short it
    is inflated by the shuffle buffers, full (1,000 samples a worker) by the first batch;
  - bytes read from the store and requests to it, per epoch (the open's traffic counted in
    epoch 1), and by kind in ``--json``;
  - CPU seconds: the readers' processes and their workers; the S3 server's; the proxy's (this
    process).
Predicted: ``shardstream.plan(...)`` for the same job shape (``nodes=1,
gpus_per_node=procs, workers=2, batch_size=64, shuffle=True, seed=0, cache_bytes, epochs``)
with the store figures imposed (``latency_ms``: the proxy's delay plus the base latency
measured here, the median of 20 one-byte ranged GETs through the proxy with no delay;
``bandwidth_per_node``: the cap, where there is one) and ``probe=True`` for the rest (the
planner measures ``bandwidth_per_stream``, ``cpu_s_per_sample`` and, uncapped,
``bandwidth_per_node`` itself, through a proxy set as the scenario's; the figures given win).
The planner runs in a process of its own (``--_plan``): its probe times its process's CPU,
which must not include the proxy's thread here.
The planner's figures and its first-batch terms are printed under each scenario. Goals,
printed PASS/FAIL per scenario: bytes and requests within 1%, samples/s and time to first
batch within 25%.

On a 2-core machine the S3 server, the proxy, the readers and their workers share the cores:
the uncapped scenarios are bound by that CPU (the planner is told nothing of cores); the
capped ones by the cap. The whole run takes ~3 minutes here; ``--quick`` (``plain``,
``lat50``, ``cap40``, ``cache-cap60``) about one.

Usage:
    python bench/plan_check.py [--quick] [--scenarios NAME,...] [--samples 6000] [--sample-kb 80]
        [--shard-mib 24] [--workdir DIR] [--timeout-s 180] [--json]

Scenarios (``--scenarios``): ``plain``, ``lat5``, ``lat20``, ``lat50`` (added latency, one
process), ``cap40`` (40 MB/s), ``2proc-cap40``, ``mix-lat20``, ``2proc-mix-cap40`` (the
mixture), ``cache-cap60`` (a cache of 1.2x the dataset, 2 epochs), ``2proc-halfcache-cap60``
(0.5x, 2 epochs). Logs under ``WORKDIR/logs/``: each reader's stderr
(``SCENARIO-RANK.log``), every request the proxy answered (``SCENARIO-requests.jsonl``: phase,
time, kind, path, range, status, bytes) and each process's reports (``SCENARIO-reports.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from corpus import CACHE, boto3_client, upload_tree, write_once  # noqa: E402
from procs import process_cpu_s  # noqa: E402

BUCKET = "plan"
BATCH = 64
WORKERS = 2
MSG = "PLAN-CHECK "
GOAL_EXACT = 0.01  # bytes and requests: within 1%
GOAL_RATE = 0.25  # samples/s and time to first batch: within 25%


# ---------------------------------------------------------------- the datasets


def sample_of(item: tuple[int, int, int]) -> dict[str, Any]:
    """Sample ``i`` of a dataset (deterministic): ``bin`` random bytes and a ``cls`` label."""
    import numpy as np

    i, sample_bytes, seed = item
    rng = np.random.default_rng([seed, i])
    size = int(sample_bytes * rng.uniform(0.8, 1.2))
    return {"__key__": f"{i:08d}", "bin": rng.bytes(size), "cls": str(i % 100).encode()}


def write_dataset(folder: Path, samples: int, sample_bytes: int, shard_bytes: int, seed: int) -> float:
    from shardstream import pack_samples

    items = [(i, sample_bytes, seed) for i in range(samples)]
    return write_once(
        folder,
        lambda out: pack_samples(sample_of, items, out, max_shard_bytes=shard_bytes, progress=False, overwrite=True),
    )


def upload(client: Any, folder: Path, prefix: str) -> None:
    upload_tree(client, folder, BUCKET, prefix)


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != ".complete")


def shard_bytes_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.tar"))


# ---------------------------------------------------------------- the traffic at the proxy


def request_kind(method: str, path_qs: str, headers: Mapping[str, str]) -> str:
    """``GET range``, ``GET``, ``HEAD``, ``LIST`` or the method (a PUT, say)."""
    parsed = urllib.parse.urlsplit(path_qs)
    if method == "HEAD":
        return "HEAD"
    if method != "GET":
        return method
    query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    if "list-type" in query or "prefix" in query or "delimiter" in query or parsed.path.strip("/").count("/") == 0:
        return "LIST"
    return "GET range" if "Range" in headers or "range" in headers else "GET"


class Traffic:
    """Requests and response body bytes by kind, as the proxy's ``on_response`` reports them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.errors = 0  # answers of status >= 400 (counted in their kind too)
        self.log: list[dict[str, Any]] = []  # every answer, for WORKDIR/logs/SCENARIO-requests.jsonl
        self.phase = "open"

    def on_response(self, method: str, path_qs: str, headers: Mapping[str, str], status: int, sent: int) -> None:
        kind = request_kind(method, path_qs, headers)
        with self.lock:
            self.requests[kind] += 1
            self.bytes[kind] += sent
            self.errors += status >= 400
            self.log.append(
                {
                    "phase": self.phase,
                    "t": round(time.time(), 4),
                    "kind": kind,
                    "path": path_qs,
                    "range": headers.get("Range"),
                    "status": status,
                    "bytes": sent,
                }
            )

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": dict(self.requests), "bytes": dict(self.bytes), "errors": self.errors}


def minus(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": dict(Counter(after["requests"]) - Counter(before["requests"])),
        "bytes": dict(Counter(after["bytes"]) - Counter(before["bytes"])),
        "errors": after["errors"] - before["errors"],
    }


def plus(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": dict(Counter(a["requests"]) + Counter(b["requests"])),
        "bytes": dict(Counter(a["bytes"]) + Counter(b["bytes"])),
        "errors": a["errors"] + b["errors"],
    }


# ---------------------------------------------------------------- one reader process


def count_batch(samples: Any) -> int:
    """DataLoader collate: the batch's sample count (nothing crosses from the workers but it)."""
    return len(samples)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reader_main(spec: dict[str, Any]) -> None:
    """One process of the job (``--_reader SPEC``): open the dataset, read ``epochs`` epochs,
    reporting each phase on stdout and waiting for the parent's ``go`` after each."""
    started = time.perf_counter()
    import torch
    from torch.utils.data import DataLoader

    from shardstream import S3Config, ShardDataset, Source

    torch.set_num_threads(1)

    def report(phase: str, **values: Any) -> None:
        print(MSG + json.dumps({"phase": phase, **values}), flush=True)
        if sys.stdin.readline().strip() != "go":
            sys.exit(1)

    def cpu_s() -> float:
        return time.process_time() + children_cpu_s()

    import aiobotocore.session  # noqa: F401 (the S3 library, imported lazily by the first S3 read: start-up)

    report("ready", import_s=time.perf_counter() - started)
    s3 = S3Config(**spec["s3"])
    location = spec["location"]
    source = [Source(loc, name=name) for name, loc in location] if isinstance(location, list) else location
    cache = {}
    if spec["cache_dir"]:
        cache = {"cache_dir": spec["cache_dir"], "cache_limit_bytes": spec["cache_limit_bytes"]}
    cpu, t0, open_wall = cpu_s(), time.perf_counter(), time.time()
    dataset = ShardDataset(source, s3=s3, shuffle=True, seed=0, batch_size=BATCH, **cache)
    opened = time.perf_counter() - t0
    report("open", open_s=opened, open_wall=open_wall, cpu_s=cpu_s() - cpu, samples_per_epoch=len(dataset))
    for epoch in range(spec["epochs"]):
        dataset.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=count_batch)
        cpu, t0, start_wall = cpu_s(), time.perf_counter(), time.time()
        first_at = first_wall = None
        first_batch = samples = 0
        for batch in loader:
            if first_at is None:
                first_at, first_wall, first_batch = time.perf_counter(), time.time(), batch
            samples += batch
        end_at, end_wall = time.perf_counter(), time.time()
        del loader  # its workers end (and are reaped: their CPU is counted)
        stats = dataset.stats()
        report(
            "epoch",
            epoch=epoch,
            samples=samples,
            first_batch_samples=first_batch,
            iter_to_first_s=None if first_at is None else first_at - t0,
            start_wall=start_wall,
            first_wall=first_wall,
            end_wall=end_wall,
            seconds=end_at - t0,
            cpu_s=cpu_s() - cpu,
            cache_hits=stats.cache_hits,
            cache_misses=stats.cache_misses,
            cache_bypasses=stats.cache_bypasses,
            retries=stats.retries,
        )


# ---------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    name: str
    procs: int = 1  # processes (ranks) of the one node, a GPU each
    delay_ms: float = 0.0  # added by the proxy to every request
    cap_mb_s: float | None = None  # the proxy's bandwidth cap (MB/s, all connections)
    mixed: bool = False  # big + small as a mixture
    cache: float = 0.0  # node cache limit as a multiple of the dataset's bytes (0: none)
    epochs: int = 1
    quick: bool = False  # in --quick's subset

    def describe(self) -> str:
        parts = [f"{self.procs} proc", f"+{self.delay_ms:g} ms"]
        if self.cap_mb_s:
            parts.append(f"cap {self.cap_mb_s:g} MB/s")
        if self.mixed:
            parts.append("mixture")
        if self.cache:
            parts.append(f"cache {self.cache:g}x")
        parts.append(f"{self.epochs} epoch{'s' * (self.epochs > 1)}")
        return ", ".join(parts)


SCENARIOS = [
    Scenario("plain", quick=True),
    Scenario("lat5", delay_ms=5),
    Scenario("lat20", delay_ms=20),
    Scenario("lat50", delay_ms=50, quick=True),
    Scenario("cap40", delay_ms=5, cap_mb_s=40, quick=True),
    Scenario("2proc-cap40", procs=2, delay_ms=20, cap_mb_s=40),
    Scenario("mix-lat20", delay_ms=20, mixed=True),
    Scenario("2proc-mix-cap40", procs=2, delay_ms=5, cap_mb_s=40, mixed=True),
    Scenario("cache-cap60", delay_ms=20, cap_mb_s=60, cache=1.2, epochs=2, quick=True),
    Scenario("2proc-halfcache-cap60", procs=2, delay_ms=5, cap_mb_s=60, cache=0.5, epochs=2),
]


@dataclass
class Measured:
    """What one scenario's job did."""

    phases: list[dict[str, Any]] = field(default_factory=list)  # per process: its reports
    traffic: list[dict[str, Any]] = field(default_factory=list)  # open, then each epoch
    server_cpu_s: float = 0.0
    proxy_cpu_s: float = 0.0
    wall_s: float = 0.0
    error: str = ""
    log: list[dict[str, Any]] = field(default_factory=list)  # every answer (Traffic.log)


class Env:
    """The server, the datasets' locations and how a scenario's job is run."""

    def __init__(self, server: Any, workdir: Path, scratch: Path, timeout_s: float) -> None:
        self.server, self.info = server, server.info
        self.workdir, self.scratch, self.timeout_s = workdir, scratch, timeout_s
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def s3_spec(self, endpoint_url: str) -> dict[str, str]:
        return {
            "endpoint_url": endpoint_url,
            "access_key_id": self.info.access_key_id,
            "secret_access_key": self.info.secret_access_key,
            "region_name": self.info.region_name,
        }

    def proxy(self, scenario: Scenario, traffic: Traffic | None) -> Any:
        from servers.faultproxy import FaultProxy

        return FaultProxy(
            self.info.endpoint_url,
            rates={"delay": 1.0} if scenario.delay_ms else {},
            delay_s=scenario.delay_ms / 1e3,
            bandwidth_bytes_per_s=scenario.cap_mb_s * 1e6 if scenario.cap_mb_s else None,
            on_response=traffic.on_response if traffic is not None else None,
        )

    def location(self, scenario: Scenario) -> str | list[tuple[str, str]]:
        big = f"s3://{BUCKET}/big"
        return [("big", big), ("small", f"s3://{BUCKET}/small")] if scenario.mixed else big

    def run(self, scenario: Scenario, dataset_bytes: int) -> Measured:
        measured = Measured()
        traffic = Traffic()
        cache_dir = self.scratch / f"cache-{scenario.name}" if scenario.cache else None
        with self.proxy(scenario, traffic) as proxy:
            spec = {
                "s3": self.s3_spec(proxy.endpoint_url),
                "location": self.location(scenario),
                "cache_dir": str(cache_dir) if cache_dir else None,
                "cache_limit_bytes": int(scenario.cache * dataset_bytes) if cache_dir else None,
                "epochs": scenario.epochs,
            }
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RANK", "WORLD_SIZE", "LOCAL_"))}
            env.update(OMP_NUM_THREADS="1", AWS_EC2_METADATA_DISABLED="true")
            procs, logs = [], []
            for rank in range(scenario.procs):
                log = (self.logs / f"{scenario.name}-{rank}.log").open("w")
                logs.append(log)
                rank_env = dict(env)
                if scenario.procs > 1:
                    rank_env.update(
                        RANK=str(rank), WORLD_SIZE=str(scenario.procs), LOCAL_RANK=str(rank),
                        LOCAL_WORLD_SIZE=str(scenario.procs),
                    )  # fmt: skip
                command = [sys.executable, __file__, "--_reader", json.dumps(spec)]
                pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": log, "text": True}
                procs.append(subprocess.Popen(command, env=rank_env, **pipes))
            measured.phases = [[] for _ in procs]
            deadline = time.monotonic() + self.timeout_s
            timer = threading.Timer(self.timeout_s, lambda: [p.kill() for p in procs])
            timer.start()
            try:
                phases = 2 + scenario.epochs  # ready, open, each epoch
                before = traffic.snapshot()
                server_cpu = proxy_cpu = 0.0
                for phase in range(phases):
                    for rank, p in enumerate(procs):
                        message = read_message(p)
                        if message is None:
                            log_path = self.logs / f"{scenario.name}-{rank}.log"
                            raise RuntimeError(f"rank {rank} ended (rc {p.poll()}) or timed out: see {log_path}")
                        measured.phases[rank].append(message)
                    now = traffic.snapshot()
                    if phase == 0:  # ready: imports done; from here the job's phases are measured
                        server_cpu, proxy_cpu = process_cpu_s(self.server.pid), time.process_time()
                        started = time.perf_counter()
                    else:
                        measured.traffic.append(minus(now, before))
                    before = now
                    traffic.phase = "open" if phase == 0 else f"epoch {phase}"
                    for p in procs:
                        p.stdin.write("go\n")
                        p.stdin.flush()
                measured.wall_s = time.perf_counter() - started
                measured.server_cpu_s = process_cpu_s(self.server.pid) - server_cpu
                measured.proxy_cpu_s = time.process_time() - proxy_cpu
                for p in procs:
                    p.wait(max(1.0, deadline - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 (reported in the table)
                measured.error = f"{type(exc).__name__}: {exc}"[:200]
                for p in procs:
                    p.kill()
            finally:
                timer.cancel()
                for p in procs:
                    p.wait()
                for log in logs:
                    log.close()
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)
        with (self.logs / f"{scenario.name}-requests.jsonl").open("w") as out:
            out.writelines(json.dumps(entry) + "\n" for entry in traffic.log)
        (self.logs / f"{scenario.name}-reports.json").write_text(json.dumps(measured.phases))
        measured.log = traffic.log
        return measured


def read_message(p: subprocess.Popen[str]) -> dict[str, Any] | None:
    """The next message of reader ``p`` (other lines on its stdout are skipped); None if it ended."""
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith(MSG):
            return json.loads(line[len(MSG) :])
    return None


def summarise(scenario: Scenario, measured: Measured) -> dict[str, Any]:
    """The job's figures: per epoch, and time to first batch."""
    out: dict[str, Any] = {"epochs": []}
    opens = [phases[1] for phases in measured.phases]
    for epoch in range(scenario.epochs):
        reports = [phases[2 + epoch] for phases in measured.phases]
        traffic = measured.traffic[1 + epoch]
        if epoch == 0:
            traffic = plus(traffic, measured.traffic[0])  # the open's requests count in epoch 1
        samples = sum(r["samples"] for r in reports)
        span = max(r["end_wall"] for r in reports) - min(r["start_wall"] for r in reports)
        after_first = sum(r["samples"] - r["first_batch_samples"] for r in reports)
        span_after_first = max(r["end_wall"] for r in reports) - min(r["first_wall"] for r in reports)
        out["epochs"].append(
            {
                "samples": samples,
                "samples_per_s": samples / span if span > 0 else None,
                "samples_per_s_after_first_batch": after_first / span_after_first if span_after_first > 0 else None,
                "seconds": max(r["seconds"] for r in reports),
                "iter_to_first_batch_s": max(r["iter_to_first_s"] for r in reports),
                "bytes": sum(traffic["bytes"].values()),
                "requests": sum(traffic["requests"].values()),
                "by_kind": traffic,
                "reader_cpu_s": sum(r["cpu_s"] for r in reports),
                "cache_hits": sum(r["cache_hits"] for r in reports),
                "cache_misses": sum(r["cache_misses"] for r in reports),
                "cache_bypasses": sum(r["cache_bypasses"] for r in reports),
                "retries": sum(r["retries"] for r in reports),
            }
        )
    first = [phases[2] for phases in measured.phases]
    out["time_to_first_batch_s"] = max(o["open_s"] + f["iter_to_first_s"] for o, f in zip(opens, first, strict=True))
    first_batch_at = max(f["first_wall"] for f in first)
    out["bytes_by_first_batch"] = sum(  # answers complete by then (the open's included): a lower bound
        x["bytes"] for x in measured.log if x["phase"] in ("open", "epoch 1") and x["t"] <= first_batch_at
    )
    out["open_s"] = max(o["open_s"] for o in opens)
    out["open_traffic"] = measured.traffic[0]
    out["reader_cpu_s"] = sum(o["cpu_s"] for o in opens) + sum(e["reader_cpu_s"] for e in out["epochs"])
    out["server_cpu_s"] = measured.server_cpu_s
    out["proxy_cpu_s"] = measured.proxy_cpu_s
    out["wall_s"] = measured.wall_s
    return out


# ---------------------------------------------------------------- the store's base figures


def base_latency_ms(env: Env) -> float:
    """Median time of 20 one-byte ranged GETs through a proxy with no delay and no cap."""
    import boto3
    from botocore.config import Config

    with env.proxy(Scenario("base"), None) as proxy:
        client = boto3.client(
            "s3",
            endpoint_url=proxy.endpoint_url,
            aws_access_key_id=env.info.access_key_id,
            aws_secret_access_key=env.info.secret_access_key,
            region_name=env.info.region_name,
            config=Config(s3={"addressing_style": "path"}),
        )
        key = next(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="big/")["Contents"])
        times = []
        for i in range(21):
            started = time.perf_counter()
            client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={i}-{i}")["Body"].read()
            times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times[1:])  # the first opens the connection


# ---------------------------------------------------------------- the prediction


def plan_main(spec: dict[str, Any]) -> None:
    """``--_plan SPEC``: ``shardstream.plan(...)`` in a process of its own (its probe times this
    process's CPU: the proxy's thread, in the parent, must not count), printed as JSON."""
    import shardstream
    from shardstream import S3Config, Source

    plan = getattr(shardstream, "plan", None)
    if plan is None:  # not exported yet
        from shardstream.planner import plan
    location = spec["location"]
    dataset = [Source(loc, name=name) for name, loc in location] if isinstance(location, list) else location
    result = plan(dataset, s3=S3Config(**spec["s3"]), **spec["kwargs"])
    print(MSG + json.dumps(result.to_dict()), flush=True)


def predict(env: Env, scenario: Scenario, base_ms: float) -> tuple[dict[str, Any] | None, dict[str, Any], str]:
    """``(plan.to_dict(), the arguments given, error)`` for the scenario's job (module doc)."""
    kwargs: dict[str, Any] = {
        "nodes": 1,
        "gpus_per_node": scenario.procs,
        "workers": WORKERS,
        "batch_size": BATCH,
        "shuffle": True,
        "seed": 0,
        "epochs": scenario.epochs,
        "cache_bytes": int(scenario.cache * env.dataset_bytes(scenario)) if scenario.cache else 0,
        "latency_ms": base_ms + scenario.delay_ms,
        "probe": True,  # bandwidth_per_stream and cpu_s_per_sample; the figures given win
    }
    if scenario.cap_mb_s:
        kwargs["bandwidth_per_node"] = scenario.cap_mb_s * 1e6
    # the probe stops reading mid-shard: the proxy's log of the GETs it abandons is noise
    server_log = logging.getLogger("aiohttp.server")
    level = server_log.level
    server_log.setLevel(logging.CRITICAL)
    try:
        with env.proxy(scenario, None) as proxy:  # the planner reads the index (and probes) as the job does
            spec = {"location": env.location(scenario), "s3": env.s3_spec(proxy.endpoint_url), "kwargs": kwargs}
            env_vars = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            done = subprocess.run(
                [sys.executable, __file__, "--_plan", json.dumps(spec)],
                capture_output=True, text=True, timeout=env.timeout_s, env=env_vars,
            )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, kwargs, f"the planner took over {env.timeout_s:.0f} s"
    finally:
        server_log.setLevel(level)
    for line in done.stdout.splitlines():
        if line.startswith(MSG):
            return json.loads(line[len(MSG) :]), kwargs, ""
    lines = (done.stderr.strip() or f"exit code {done.returncode}").splitlines()
    return None, kwargs, lines[-1][:300]


# ---------------------------------------------------------------- the table


def per_epoch(value: Any, epoch: int) -> Any:
    if isinstance(value, list):
        return value[epoch] if epoch < len(value) else None
    return value


def compare(scenario: Scenario, predicted: dict[str, Any] | None, got: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of (metric, predicted, measured, ratio, within, pass)."""
    rows = []

    def row(metric: str, pred: Any, meas: Any, tolerance: float | None) -> None:
        ratio = pred / meas if isinstance(pred, (int, float)) and isinstance(meas, (int, float)) and meas else None
        ok = None if ratio is None or tolerance is None else abs(ratio - 1) <= tolerance
        if tolerance is not None and meas == 0 and pred == 0:
            ratio, ok = 1.0, True
        rows.append({"metric": metric, "predicted": pred, "measured": meas, "ratio": ratio, "pass": ok})

    p = predicted or {}
    row("time to first batch (s)", p.get("time_to_first_batch_s"), got["time_to_first_batch_s"], GOAL_RATE)
    for epoch, e in enumerate(got["epochs"]):
        tag = f" e{epoch + 1}" if scenario.epochs > 1 else ""
        rate = per_epoch(p.get("samples_per_s_per_epoch", p.get("samples_per_s")), epoch)  # the scalar: the slowest
        row(f"samples/s{tag}", rate, e["samples_per_s"], GOAL_RATE)
        row(f"bytes{tag}", per_epoch(p.get("egress_bytes_per_epoch"), epoch), e["bytes"], GOAL_EXACT)
        row(f"requests{tag}", per_epoch(p.get("requests_per_epoch"), epoch), e["requests"], GOAL_EXACT)
        if scenario.cache:
            lookups = e["cache_hits"] + e["cache_misses"]
            row(
                f"cache hit rate{tag}",
                per_epoch(p.get("cache_hit_rate"), epoch),
                e["cache_hits"] / lookups if lookups else None,
                None,
            )
    return rows


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and abs(value) >= 1e4):
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "FAIL")


def kinds(traffic: dict[str, Any]) -> str:
    return ", ".join(
        f"{kind} {traffic['requests'][kind]} ({traffic['bytes'].get(kind, 0) / 1e6:.2f} MB)"
        for kind in sorted(traffic["requests"])
    )


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~1-minute subset of the scenarios")
    parser.add_argument("--scenarios", help="comma-separated names (default: all, or --quick's)")
    parser.add_argument("--samples", type=int, default=6000, help="samples of the big dataset (default 6000)")
    parser.add_argument("--sample-kb", type=int, default=80, help="its mean sample size, KB (default 80)")
    parser.add_argument("--shard-mib", type=int, default=24, help="its shard size, MiB (default 24)")
    parser.add_argument("--workdir", help=f"datasets and logs (default {CACHE}/plan-check)")
    parser.add_argument("--timeout-s", type=float, default=180, help="bound on each scenario's job (default 180)")
    parser.add_argument("--json", action="store_true", help="also print one line of JSON results")
    parser.add_argument("--_reader", help=argparse.SUPPRESS)
    parser.add_argument("--_plan", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._reader:
        reader_main(json.loads(args._reader))
        return 0
    if args._plan:
        plan_main(json.loads(args._plan))
        return 0

    from shardstream.testing import SeaweedS3Server

    scenarios = [s for s in SCENARIOS if s.quick or not args.quick]
    if args.scenarios:
        wanted = args.scenarios.split(",")
        unknown = set(wanted) - {s.name for s in SCENARIOS}
        if unknown:
            parser.error(f"unknown scenarios {sorted(unknown)}; known: {[s.name for s in SCENARIOS]}")
        scenarios = [s for s in SCENARIOS if s.name in wanted]
    workdir = Path(args.workdir or CACHE / "plan-check")
    tag = f"{args.samples}x{args.sample_kb}kb-{args.shard_mib}mib"
    big, small = workdir / f"big-{tag}", workdir / "small-1000x20kb-4mib"
    for folder, n, kb, mib, seed in ((big, args.samples, args.sample_kb, args.shard_mib, 1), (small, 1000, 20, 4, 2)):
        seconds = write_dataset(folder, n, kb * 1000, mib << 20, seed)
        print(f"{folder.name}: {f'written in {seconds:.1f} s' if seconds else 'kept'} at {folder}", flush=True)

    results: dict[str, Any] = {"scenarios": []}
    with tempfile.TemporaryDirectory(prefix="shardstream-plan-check-") as tmp, SeaweedS3Server() as server:
        server.create_bucket(BUCKET)
        info = server.info
        client = boto3_client(info)
        started = time.perf_counter()
        upload(client, big, "big")
        upload(client, small, "small")
        env = Env(server, workdir, Path(tmp), args.timeout_s)
        sizes = {"big": shard_bytes_of(big), "small": shard_bytes_of(small)}
        env.dataset_bytes = lambda s: sizes["big"] + (sizes["small"] if s.mixed else 0)  # type: ignore[attr-defined]
        shards = {name: len(list(folder.glob("*.tar"))) for name, folder in (("big", big), ("small", small))}
        base_ms = base_latency_ms(env)
        print(
            f"uploaded in {time.perf_counter() - started:.1f} s: big {args.samples} samples, {shards['big']} shards, "
            f"{sizes['big'] / 1e6:.1f} MB of shards ({tree_bytes(big) / 1e6:.1f} MB with the index); "
            f"small 1000 samples, {shards['small']} shards, {sizes['small'] / 1e6:.1f} MB; "
            f"base latency through the proxy {base_ms:.1f} ms; {os.cpu_count()} cores",
            flush=True,
        )
        results.update(base_latency_ms=base_ms, dataset_bytes=sizes, shards=shards, cores=os.cpu_count())

        header = f"{'scenario':24s} {'metric':26s} {'predicted':>12s} {'measured':>12s} {'ratio':>7s}  goal"
        for scenario in scenarios:
            predicted, given, error = predict(env, scenario, base_ms)
            measured = env.run(scenario, env.dataset_bytes(scenario))
            entry: dict[str, Any] = {"scenario": scenario.name, "setup": asdict(scenario), "plan_args": given}
            print(f"\n== {scenario.name}: {scenario.describe()}", flush=True)
            if error:
                print(f"   planner: {error}")
                entry["plan_error"] = error
            if measured.error:
                print(f"   ERROR: {measured.error}")
                entry["error"] = measured.error
                results["scenarios"].append(entry)
                continue
            got = summarise(scenario, measured)
            rows = compare(scenario, predicted, got)
            entry.update(predicted=predicted, measured=got, rows=rows)
            print(header)
            for r in rows:
                print(
                    f"{scenario.name:24s} {r['metric']:26s} {fmt(r['predicted']):>12s} {fmt(r['measured']):>12s} "
                    f"{fmt(r['ratio']):>7s}  {verdict(r['pass'])}"
                )
            for epoch, e in enumerate(got["epochs"]):
                print(f"   epoch {epoch + 1} requests: {kinds(e['by_kind'])}")
            print(
                f"   open {got['open_s']:.2f} s ({kinds(got['open_traffic'])}); iterator to first batch "
                f"{got['epochs'][0]['iter_to_first_batch_s']:.2f} s, {got['bytes_by_first_batch'] / 1e6:.1f} MB "
                "read by then; samples/s after the first batch "
                + ", ".join(fmt(e["samples_per_s_after_first_batch"]) for e in got["epochs"])
                + f"; CPU s: readers {got['reader_cpu_s']:.1f}, "
                f"S3 server {got['server_cpu_s']:.1f}, proxy {got['proxy_cpu_s']:.1f} over {got['wall_s']:.1f} s"
            )
            if predicted:
                figures = ", ".join(
                    f"{k} {fmt(v['value'])} ({v['source']})" for k, v in (predicted.get("figures") or {}).items()
                )
                print(
                    f"   planner: bound by {predicted.get('bound_by_per_epoch', predicted.get('bound_by'))}; "
                    f"first batch {predicted.get('timings', {}).get('first_batch')}; figures: {figures}"
                )
            results["scenarios"].append(entry)

    verdicts = [
        (s["scenario"], r["pass"]) for s in results["scenarios"] for r in s.get("rows", []) if r["pass"] is not None
    ]
    print("\nscenario                 goals")
    for scenario in scenarios:
        mine = [ok for name, ok in verdicts if name == scenario.name]
        entry = next(s for s in results["scenarios"] if s["scenario"] == scenario.name)
        state = "ERROR" if "error" in entry else ("PASS" if mine and all(mine) else ("FAIL" if mine else "-"))
        print(f"{scenario.name:24s} {state} ({sum(mine)}/{len(mine)} within goal)")
    results["passed"] = sum(ok for _, ok in verdicts)
    results["goals"] = len(verdicts)
    if args.json:
        print(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
