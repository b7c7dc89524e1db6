"""``plan(..., probe=True)``: the store's figures measured from this machine, against the
dataset's own store, through the storage layer the readers use (:func:`~shardstream.storage.open_store`,
``get_range``): no HTTP code of its own.

- ``latency_ms``: the median time of small ranged GETs (4 KiB at the head of a few shards):
  their first byte and the few bytes after it;
- ``bandwidth_per_stream``: one ranged GET of ``part_bytes`` at a time (bytes / time, the
  latency included, as a reader's GET sees it);
- ``bandwidth_per_node``: ``streams`` ranged GETs of ``part_bytes`` at once (a lower bound of
  the node's: one process, one event loop);
- ``cpu_s_per_sample``: the process CPU time of a ``ShardDataset(decode=None)`` (parsing)
  over a few hundred samples, read in this process after the first 50 (imports, the client's
  connections and first reads, whose CPU is start-up, not per sample) not counted; with
  ``decode`` also with that decoder (``cpu_s_per_sample`` is then the decoding one; the parse
  figure stays in ``parse_cpu_s_per_sample``);
- ``cpu_s_per_sample_cached``: the same, reading samples a second time from a node cache
  (``cache_dir=`` a temporary directory a first read filled), shuffled as a job reads them
  (one lane, a shuffle buffer of 100): node-cache hits, parsed from local files;
- ``cache_bandwidth_per_node``: bytes/s of reading that cache's entries back (1 MiB reads,
  one reader; the temporary directory's disk, just written: give the cache disk's own figure
  where ``cache_dir`` is elsewhere or larger than memory);
- ``client_s``: a new store client's first request (a 1-byte ranged GET) less the latency,
  in this process (its client library loaded, as in a forked worker): what each DataLoader
  worker pays, once, for its own client;
- ``worker_start_s``: the time from ``iter(DataLoader(d, num_workers=1))`` to its first item,
  ``d`` a dataset of one item that reads nothing: a worker's fork and set-up. None where a
  DataLoader worker cannot start here.
- ``store_cpu_s_per_byte``: the CPU the rest of this machine spent (all its cores, from
  ``/proc/stat``, less this process's) per byte while the aggregate bandwidth was measured: a
  store (or proxy) running on this machine, whose CPU the readers share (~0 where the store
  is remote and the machine otherwise idle); None off Linux;
- ``open_s`` is not the probe's: the planner times making the job's ``ShardDataset`` before
  anything else touches the store in its process (the client made cold, the index read, the
  reader set up; imports before it, as start-up).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config

__all__ = ["probe"]


def probe(
    location: str | os.PathLike[str] | None,
    *,
    s3: S3Config | None = None,
    fetch: FetchConfig | None = None,
    decode: Any = None,
    samples: int = 300,
    streams: int = 8,
    small_gets: int = 8,
) -> dict[str, Any]:
    """Measure the store's figures for the dataset at ``location`` (module doc).

    Args:
        location: the dataset (its directory or prefix, or its index file).
        s3: the S3 endpoint for ``s3://`` datasets.
        fetch: its ``part_bytes`` sizes the bandwidth GETs (default FetchConfig's, 16 MiB; at
            most a shard).
        decode: the decoder the CPU figure is also timed with (``ShardDataset(decode=)``).
        samples: samples the CPU figures read (>= 1).
        streams: GETs at once for the aggregate bandwidth (>= 1).
        small_gets: small GETs the latency is the median of (>= 1).

    Returns:
        ``{"latency_ms", "bandwidth_per_stream", "bandwidth_per_node", "cpu_s_per_sample",
        "parse_cpu_s_per_sample", "decode_cpu_s_per_sample" (None without ``decode``),
        "cpu_s_per_sample_cached", "cache_bandwidth_per_node", "store_cpu_s_per_byte",
        "client_s", "worker_start_s", "open_s" (None: the planner fills it in),
        "samples_timed", "store"}``; a figure that cannot be measured here is None.

    Raises:
        ValueError: no location, or an argument < 1.
        ShardNotFoundError, StorageError: the dataset or its store cannot be read.
    """
    if location is None:
        raise ValueError("probe needs the dataset's location (plan_counts has none: pass figures instead)")
    for name, value in (("samples", samples), ("streams", streams), ("small_gets", small_gets)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    from ..index.resolve import open_index

    index = open_index(location, s3=s3)
    fetch = fetch or FetchConfig()
    store = _store_figures(index, s3=s3, fetch=fetch, small_gets=small_gets, streams=streams)
    parse = _cpu_per_sample(location, s3, fetch, None, samples)
    decoded = _cpu_per_sample(location, s3, fetch, decode, samples) if decode is not None else None
    worker_start = _worker_start()
    return {
        **{k: store[k] for k in ("store", "latency_ms", "bandwidth_per_stream", "bandwidth_per_node")},
        "cpu_s_per_sample": decoded[0] if decoded else parse[0],
        "parse_cpu_s_per_sample": parse[0],
        "decode_cpu_s_per_sample": decoded[0] if decoded else None,
        "cpu_s_per_sample_cached": (decoded or parse)[2],
        "cache_bandwidth_per_node": parse[3],
        "store_cpu_s_per_byte": store["store_cpu_s_per_byte"],
        "open_s": None,  # the planner times its own opening of the index (opening.py)
        "client_s": store["client_s"],
        "worker_start_s": worker_start,
        "samples_timed": parse[1],
    }


def _store_figures(
    index: Any, *, s3: S3Config | None, fetch: FetchConfig, small_gets: int, streams: int
) -> dict[str, Any]:
    """The store's figures, from GETs of the first shards of ``index``: ``store`` (its URL),
    ``latency_ms`` (the median of ``small_gets`` 4 KiB GETs), ``bandwidth_per_stream`` and
    ``bandwidth_per_node`` (bytes/s: one GET of ``part_bytes``, ``streams`` at once),
    ``store_cpu_s_per_byte`` (the machine's other CPU while it read: a store here; else None)
    and ``client_s`` (a new client's first request, less a latency)."""
    from ..storage import loop, open_store, split_url

    urls = [index.shard_url(i) for i in range(min(index.num_shards, max(small_gets, streams)))]
    sizes = [int(index.manifest.shard_bytes[i]) for i in range(len(urls))]
    root, _ = split_url(urls[0])
    store = open_store(root or os.sep, s3=s3, fetch=fetch)
    names = [split_url(u)[1] for u in urls]

    async def timed(name: str, start: int, end: int) -> tuple[float, int]:
        began = time.perf_counter()
        pieces, _, _ = await store.get_range(name, start, end)
        return time.perf_counter() - began, sum(map(len, pieces))

    pairs = list(itertools.islice(itertools.cycle(zip(names, sizes)), small_gets))
    loop.run(timed(names[0], 0, min(4096, sizes[0])))  # a connection made first: not counted
    latency = [loop.run(timed(n, 0, min(4096, z)))[0] for n, z in pairs]
    part = min(fetch.part_bytes, max(sizes))
    big = max(zip(sizes, names))[1]
    one = [loop.run(timed(big, 0, part)) for _ in range(2)]
    stream_bw = max(b / max(s, 1e-9) for s, b in one)

    async def many() -> tuple[float, int]:
        began = time.perf_counter()
        pairs = list(itertools.islice(itertools.cycle(zip(names, sizes)), streams))
        got = await asyncio.gather(*(timed(n, 0, min(part, z)) for n, z in pairs))
        return time.perf_counter() - began, sum(b for _, b in got)

    busy, own = _busy_cpu_s(), time.process_time()
    spent, moved = loop.run(many())
    store_cpu = None
    if busy is not None:
        after = _busy_cpu_s()
        if after is not None:  # the machine's CPU beside this process's, while it read: a store here
            store_cpu = max(0.0, (after - busy) - (time.process_time() - own)) / max(moved, 1)
    lat_s = statistics.median(latency)
    # a new client (clients are kept per process and settings: other settings make one), as a
    # forked DataLoader worker makes its own: its first request, less a latency
    fresh = open_store(root or os.sep, s3=s3, fetch=fetch, requests=RequestConfig(connect_timeout_s=10.000123))
    began = time.perf_counter()
    loop.run(fresh.get_range(names[0], 0, 1))
    client_s = max(0.0, time.perf_counter() - began - lat_s)
    return {
        "store": store.url,
        "latency_ms": lat_s * 1e3,
        "bandwidth_per_stream": stream_bw,
        "bandwidth_per_node": max(moved / max(spent, 1e-9), stream_bw),
        "store_cpu_s_per_byte": store_cpu,
        "client_s": client_s,
    }


_WARM_SAMPLES = 50  # read before the CPU is timed: imports, the client's connections, the first parts


def _cpu_per_sample(
    location: Any, s3: Any, fetch: FetchConfig, decode: Any, samples: int
) -> tuple[float, int, float | None, float | None]:
    """``(CPU s a sample, samples timed, CPU s a sample from the node cache, bytes/s of
    reading its entries back)`` of a ShardDataset read here
    (no DataLoader workers): read from the store (timed after the first samples); then the
    whole shards those samples lie in read through a node cache in a temporary directory
    (filled), and read again from it (timed: all hits)."""

    from ..dataset import ShardDataset  # torch: only when probing

    kwargs = {"decode": decode, "s3": s3, "fetch": fetch or FetchConfig(), "shuffle": False}
    warm = min(_WARM_SAMPLES, samples)
    remote = _timed(ShardDataset(location, **kwargs), warm, samples)
    try:
        cached, disk = _cached_cpu(location, kwargs, warm, samples)
    except Exception:  # noqa: BLE001 (no cache here: the default figures are used)
        cached, disk = (None, 0), None
    return remote[0], remote[1], cached[0], disk


_SHUFFLE_BUFFER = 100  # the cache passes read as a shuffled job does (one lane, a small buffer)


def _cached_cpu(
    location: Any, kwargs: dict[str, Any], warm: int, samples: int
) -> tuple[tuple[float | None, int], float | None]:
    """The cache passes of :func:`_cpu_per_sample`, shuffled as a job reads (one lane, a
    shuffle buffer of :data:`_SHUFFLE_BUFFER`, one shard in flight): the first fills the
    cache far enough that the second's arrivals (at most its samples + the buffer) lie in
    shards the first read whole (before the shard holding its last arrival)."""
    import dataclasses
    import gc
    import tempfile

    from ..dataset import ShardDataset

    kwargs = {
        **kwargs,
        "fetch": dataclasses.replace(kwargs["fetch"], max_inflight_shards=1),
        "shuffle": True,
        "seed": 0,
        "shuffle_buffer": _SHUFFLE_BUFFER,
        "max_open_shards": 1,
    }
    with tempfile.TemporaryDirectory(prefix="shardstream-probe-", ignore_cleanup_errors=True) as cache_dir:
        dataset = ShardDataset(location, cache_dir=cache_dir, cache_limit_bytes=1 << 40, **kwargs)
        largest = int(dataset.index.manifest.shard_samples.max())
        total = int(dataset.index.manifest.shard_samples.sum())
        first = min(total, warm + samples + _SHUFFLE_BUFFER + largest + 1)
        dataset.set_epoch(0)
        it = iter(dataset)
        for _ in itertools.islice(it, first):
            pass
        del it
        gc.collect()  # the pass is closed
        room = max(2, first - largest - _SHUFFLE_BUFFER - 1)  # the second pass's samples, all hits
        dataset.set_epoch(0)
        cached = _timed(dataset, min(warm, room // 2), min(samples, room - min(warm, room // 2)))
        disk = _read_rate(cache_dir)
    return cached, disk


def _timed(dataset: Any, warm: int, samples: int) -> tuple[float, int]:
    """Process CPU seconds a sample over ``samples`` samples of one pass after ``warm``."""
    it = iter(dataset)
    for _ in itertools.islice(it, warm):
        pass
    began, n = time.process_time(), 0
    for _ in itertools.islice(it, samples):
        n += 1
    return (time.process_time() - began) / max(1, n), n


def _busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has been busy (Linux ``/proc/stat``); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def _read_rate(folder: str) -> float | None:
    """Bytes/s of reading every file under ``folder`` back (1 MiB reads); None if too few."""
    files = [os.path.join(d, f) for d, _, names in os.walk(folder) for f in names if f.endswith(".shard")]
    began, moved = time.perf_counter(), 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                moved += len(chunk)
    spent = time.perf_counter() - began
    return moved / spent if moved >= 1 << 20 and spent > 0 else None


class _One:
    """A dataset of one item: a DataLoader worker's start, with nothing to read."""

    def __iter__(self) -> Any:
        yield 0


def _worker_start() -> float | None:
    """Seconds from ``iter(DataLoader(..., num_workers=1))`` to its first item (a dataset that
    reads nothing: the worker's fork and set-up); None where a worker cannot start here."""
    try:
        from torch.utils.data import DataLoader, IterableDataset

        class One(_One, IterableDataset):
            pass

        loader = DataLoader(One(), batch_size=None, num_workers=1)
        began = time.perf_counter()
        it = iter(loader)
        next(it)
        spent = time.perf_counter() - began
        del it
        return spent
    except Exception:  # noqa: BLE001 (no fork here, no torch: the default figure is used)
        return None
