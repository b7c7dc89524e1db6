"""Shard streams in order: remote shards as parallel ranged GETs running ahead, local shards in place.

:func:`iter_shard_streams` is the one way readers get a shard's bytes; each comes as a
:class:`~shardstream.tarstream.ShardStream`. Behind it:

- :mod:`shardstream.storage.producer`: the remote producer, one per iterator, fetching a
  reader's remote shards (S3, http(s), the Hub, GCS, Azure) as ranged GETs that run ahead
  within ``max_buffer_bytes``;
- :mod:`shardstream.storage.fill`: with a :class:`~shardstream.storage.cache.ShardCache`, cache
  hits read from local disk and misses claimed and filled into the node cache;
- :mod:`shardstream.storage.streams`: the streams themselves, local shards and cache entries
  memory-mapped, remote ones over the producer's parts or a growing cache file.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..tarstream import ShardStream
from .base import Counters, is_remote_url, split_url
from .cache import ShardCache
from .fill import CachingProducer, Growing, Hit
from .local import LocalStore
from .producer import Producer, RemoteShard, take
from .schemes import open_store
from .streams import GrowingStream, PartStream, open_local

__all__ = ["ShardStream", "iter_shard_streams"]


def iter_shard_streams(
    urls: Sequence[str],
    *,
    sizes_bytes: Sequence[int | None] | None = None,
    byte_ranges: Sequence[tuple[int, int] | None] | None = None,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
    cache: ShardCache | None = None,
    stats: Counters | None = None,
) -> Iterator[tuple[str, ShardStream]]:
    """Yield ``(url, stream)`` for each shard URL in order; ``stream.read(n)`` gives its bytes
    (or its chunks and groups: :class:`~shardstream.tarstream.ShardStream`).

    A stream is valid until the next item is requested. Local shards are read in place;
    remote shards (``s3://``, ``https://``, ``hf://``, ``gs://``, ``az://`` ...) are fetched ahead
    as the module doc says.

    Args:
        urls: shard URLs (local paths or remote URLs), in reading order.
        sizes_bytes: each shard's size from the index (checked), or None to ask S3 (HEAD).
        byte_ranges: for each shard, ``(start, end)``: read only those bytes (a stream of
            them, which ends without the tar end-of-archive blocks), or None for all of it.
            A range read with a cache fills the whole shard (from the range on, then the head).
        s3, fetch: S3 endpoint and read-ahead settings.
        requests: timeouts, attempts and connections of the requests to remote stores
            (:class:`~shardstream.config.RequestConfig`; for S3, default the S3Config's own fields).
        cache: a :class:`~shardstream.storage.cache.ShardCache` for remote shards, or None.
        stats: counters to add stall time, cache hits/misses, retries and bytes in flight to.

    Raises:
        ShardNotFoundError: a shard does not exist (raised when its stream is read, for S3).
        CorruptShardError: an S3 shard's size differs from ``sizes_bytes``, or it changed
            while being read.
        StorageAccessError, StorageConnectionError, StorageError: S3 failures; a stall of
            more than the store's ``request_limit_s`` (every attempt and the waits between
            them) raises StorageConnectionError rather than hanging.
    """
    fetch = fetch or FetchConfig()
    sizes = list(sizes_bytes) if sizes_bytes is not None else [None] * len(urls)
    if len(sizes) != len(urls):
        raise ValueError(f"{len(urls)} shard URLs but {len(sizes)} sizes")
    stores: dict[str, Any] = {}

    def store_and_name(url: str) -> tuple[Any, str]:
        root, name = split_url(url)
        if root not in stores:
            stores[root] = open_store(root or os.sep, s3=s3, requests=requests, fetch=fetch)
        return stores[root], name

    ranges = list(byte_ranges) if byte_ranges is not None else [None] * len(urls)
    if len(ranges) != len(urls):
        raise ValueError(f"{len(urls)} shard URLs but {len(ranges)} byte ranges")
    remote = [
        RemoteShard(url, *store_and_name(url), size, byte_range)
        for url, size, byte_range in zip(urls, sizes, ranges)
        if is_remote_url(url)
    ]
    producer: Producer | None = None
    if remote:
        producer = Producer(remote, fetch, stats) if cache is None else CachingProducer(remote, fetch, cache, stats)
    next_remote = 0
    try:
        for url, size, byte_range in zip(urls, sizes, ranges):
            if not is_remote_url(url):
                store, name = store_and_name(url)
                if not isinstance(store, LocalStore):
                    raise TypeError(f"{url}: no reader for this store type")
                with (
                    store.open_read(name, buffer_bytes=0) as f,
                    open_local(f, url, size, stats, fetch.chunk_bytes, byte_range, path=os.fspath(f.name)) as stream,
                ):
                    yield url, stream
                continue
            assert producer is not None  # internal invariant: built when any URL is remote
            shard = remote[next_remote]
            next_remote += 1
            yield from _consume(shard, producer, stats, wait_s=_stall_limit_s(shard), chunk_bytes=fetch.chunk_bytes)
    finally:
        if producer is not None:
            producer.cancel()
            for shard in remote:
                _discard(shard)


def _consume(
    shard: RemoteShard, producer: Producer, stats: Counters | None, *, wait_s: float, chunk_bytes: int
) -> Iterator[tuple[str, ShardStream]]:
    started = time.perf_counter()
    first = take(shard, wait_s)
    if stats is not None:
        stats.add("stall_s", time.perf_counter() - started)
    if isinstance(first, Hit):
        try:
            with open_local(first.cached, shard.url, shard.size_bytes, stats, chunk_bytes, shard.byte_range) as stream:
                yield shard.url, stream
        finally:
            first.cached.close()
            producer.shard_done()
        return
    if isinstance(first, Growing):
        try:
            yield shard.url, GrowingStream(shard, first, stats, wait_s, chunk_bytes)
            if shard.byte_range is None:  # only the tail is left: let it commit before this iterator ends
                first.wait_done(wait_s)
        finally:
            first.reader.close()  # the fill goes on to its commit by itself
            producer.shard_done()
        return
    stream = PartStream(shard, producer, stats, wait_s, first)
    try:
        yield shard.url, stream
    finally:
        stream.release()
        producer.shard_done()


def _stall_limit_s(shard: RemoteShard) -> float:
    """How long the consumer waits for data before calling the server stalled: one request's
    bound (all attempts), plus the wait for a free request slot."""
    return float(shard.store.request_limit_s)


def _discard(shard: RemoteShard) -> None:
    """After the consumer stopped: close cached files not read (a fill's own task, cancelled
    with the producer, drops its half-written entry)."""
    while True:
        try:
            item = shard.items.get_nowait()
        except queue.Empty:
            return
        if isinstance(item, Hit):
            item.cached.close()
        elif isinstance(item, Growing):
            item.reader.close()
