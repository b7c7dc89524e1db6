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
  over a few hundred samples, read in this process after a first few (imports, connections)
  not counted; with ``decode`` also with that decoder
  (``cpu_s_per_sample`` is then the decoding one; the parse figure stays in
  ``parse_cpu_s_per_sample``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from typing import Any

from ..config import FetchConfig, S3Config

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
        "samples_timed", "store"}``.

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
    from ..storage import loop, open_store, split_url

    index = open_index(location, s3=s3)
    fetch = fetch or FetchConfig()
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

    spent, moved = loop.run(many())
    parse = _cpu_per_sample(location, s3, fetch, None, samples)
    decoded = _cpu_per_sample(location, s3, fetch, decode, samples) if decode is not None else None
    return {
        "store": store.url,
        "latency_ms": statistics.median(latency) * 1e3,
        "bandwidth_per_stream": stream_bw,
        "bandwidth_per_node": max(moved / max(spent, 1e-9), stream_bw),
        "cpu_s_per_sample": decoded[0] if decoded else parse[0],
        "parse_cpu_s_per_sample": parse[0],
        "decode_cpu_s_per_sample": decoded[0] if decoded else None,
        "samples_timed": parse[1],
    }


def _cpu_per_sample(location: Any, s3: Any, fetch: FetchConfig, decode: Any, samples: int) -> tuple[float, int]:
    """Process CPU seconds per sample of a ShardDataset read here (no DataLoader workers)."""
    from ..dataset import ShardDataset  # torch: only when probing

    dataset = ShardDataset(location, decode=decode, s3=s3, fetch=fetch, shuffle=False)
    for _ in itertools.islice(dataset, min(32, samples)):  # imports, first connections: not counted
        pass
    began, n = time.process_time(), 0
    for _ in itertools.islice(dataset, samples):
        n += 1
    return (time.process_time() - began) / max(1, n), n
