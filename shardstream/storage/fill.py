"""Remote shards through the node cache: a cache hit read from local disk, a miss claimed and
filled while its reader reads the file as it grows.

With a :class:`~shardstream.storage.cache.ShardCache`, a shard found in the node-local cache is read
from local disk. A missing shard is *filled*: the producer takes the cache's per-shard lock
(without waiting) and a fill task downloads the whole shard into the cache file by itself, at
network speed, writing each part as it arrives (at most ``max_inflight_requests`` parts in
memory, outside ``max_buffer_bytes``); the consumer reads the file as it grows
(:class:`~shardstream.storage.streams.GrowingStream`), and the fill commits the entry when
complete. A reader that wants only a byte range (a shard cut at a rank or worker boundary)
fills the whole shard too, starting at its range and wrapping around to the head, which the
reader of the other range will find in the cache. When another process holds the shard's
lock, the producer waits for its entry at most ``FetchConfig.cache_wait_s`` and then reads the
shard from S3 without caching it (counted in ``stats().cache_waits`` / ``cache_bypasses``).
Why this cannot deadlock is argued in :mod:`shardstream.storage.cache`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from ..config import FetchConfig
from .base import Counters
from .cache import BUSY, CachedShard, CacheFill, ShardCache
from .producer import Producer, RemoteShard, part_ranges

__all__ = ["CacheWriteFailed", "CachingProducer", "Growing", "Hit"]


class Hit:
    """The producer found the shard in the cache: read ``cached`` instead of parts."""

    def __init__(self, cached: CachedShard) -> None:
        self.cached = cached


class CacheWriteFailed(Exception):
    """The fill could not write to the cache any more (disk full or failing): the consumer
    reads the rest of the shard from S3."""


class Growing:
    """A fill this process runs (module doc): how much of the shard is on disk, shared by the
    fill task on the loop thread and the consumer. The fill writes from ``start`` (where its
    consumer's byte range begins) to the end of the shard, then from 0 to ``start``; a consumer
    reads bytes ``start`` onwards as ``available`` says they arrive."""

    def __init__(self, fill: CacheFill, reader: CachedShard, start: int = 0) -> None:
        self.fill = fill
        self.reader = reader
        self.start = start
        self.available = start  # bytes from start to here are on disk
        self.done = False
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        self._cond = threading.Condition()

    def advance(self, nbytes: int) -> None:
        with self._cond:
            self.available += nbytes
            self._cond.notify_all()

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            self.done, self.error = True, error
            self._cond.notify_all()

    def wait_beyond(self, position: int, timeout_s: float) -> bool:
        """Wait until more than ``position`` bytes are on disk or the fill ended; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.available > position or self.done, timeout_s)

    def wait_done(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the fill to end: its last bytes are the tar's tail,
        which the parser does not read, and a DataLoader worker that is not persistent exits
        right after its last shard."""
        with self._cond:
            self._cond.wait_for(lambda: self.done, timeout_s)


class CachingProducer(Producer):
    """A :class:`~shardstream.storage.producer.Producer` that reads through the node cache
    ``cache`` (module doc): each shard's first item is a :class:`Hit`, a :class:`Growing`
    fill, or, where neither can be had, its parts as without a cache."""

    def __init__(
        self, shards: list[RemoteShard], fetch: FetchConfig, cache: ShardCache, stats: Counters | None
    ) -> None:
        self.cache = cache  # before the producer starts
        super().__init__(shards, fetch, stats)

    async def _from_cache(self, shard: RemoteShard) -> bool:
        """The shard handed on from the cache (True): a hit, or a fill started here; False: a
        miss this reader reads from S3 itself, uncached (no room, or another process's fill
        did not finish within ``cache_wait_s``)."""
        if shard.size_bytes is None:
            shard.size_bytes, shard.etag = await shard.store.head(shard.name)
        cached = await self._in_thread(self.cache.open, shard.url, size_bytes=shard.size_bytes)
        if cached is None:  # a whole shard fills the cache, also when this reader wants a range of it
            claim = await self._claim(shard)
            if isinstance(claim, Growing):
                self._count("cache_misses", 1)
                self._count("cache_fills", 1)
                shard.filling = True
                shard.items.put(claim)
                return True
            cached = claim
        if cached is not None:
            self._count("cache_hits", 1)
            shard.items.put(Hit(cached))
            return True
        self._count("cache_misses", 1)
        return False

    async def _claim(self, shard: RemoteShard) -> Growing | CachedShard | None:
        """After a cache miss: a :class:`Growing` fill started here, a hit
        (another process filled it meanwhile), or None: read it from S3 without the cache (no
        room, or another process's fill did not finish within ``cache_wait_s``)."""
        deadline = self.loop.time() + self.fetch.cache_wait_s
        pause_s, waited = 0.005, False
        while True:
            fill = await self._in_thread(self.cache.fill, shard.url, size_bytes=shard.size_bytes, wait=False)
            if fill is not None and fill is not BUSY:
                if not fill.caching:  # no room: the rest is pinned or being filled
                    fill.abort()
                    self._count("cache_bypasses", 1)
                    return None
                growing = Growing(fill, fill.reader(), start=shard.byte_range[0] if shard.byte_range else 0)
                growing.task = asyncio.ensure_future(self._fill(shard, growing))
                return growing
            if fill is BUSY and not waited:
                waited = True
                self._count("cache_waits", 1)
            cached = await self._in_thread(self.cache.open, shard.url, size_bytes=shard.size_bytes)
            if cached is not None:
                return cached
            if self.loop.time() >= deadline:
                self._count("cache_bypasses", 1)
                return None
            shard.waiting_on = f"another process's download of it into the node cache {self.cache.root}"
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.1)

    async def _fill(self, shard: RemoteShard, growing: Growing) -> None:
        """Download the whole shard into the cache file (from the consumer's start to the end,
        then the head), each part written as its turn comes, at most ``max_inflight_requests``
        parts in memory; then commit. Waits on nothing but S3, request slots (freed as GETs
        finish) and the disk: never on a consumer."""
        fill = growing.fill
        window = asyncio.Semaphore(self.fetch.max_inflight_requests)
        order: asyncio.Queue[tuple[int, asyncio.Task[list[bytes]]] | None] = asyncio.Queue()
        size, start, part = shard.size_bytes, growing.start, self.fetch.part_bytes
        assert size is not None  # internal invariant: known before a fill starts
        ramp = shard is self.shards[0]
        ranges = [*part_ranges(start, size, part, ramp=ramp), *part_ranges(0, start, part, ramp=False)]

        async def launch() -> None:
            for first, last in ranges:
                await window.acquire()
                await self.requests.acquire()
                order.put_nowait((first, self._start_get(shard, first, last)))
            order.put_nowait(None)

        launcher = asyncio.ensure_future(launch())
        try:
            while (item := await order.get()) is not None:
                offset, task = item
                pieces = await task
                await self.loop.run_in_executor(None, fill.write_at, offset, pieces)
                if not fill.caching:
                    raise CacheWriteFailed(f"{shard.url}: the node cache stopped taking its bytes (disk full?)")
                if offset >= start:
                    growing.advance(sum(map(len, pieces)))
                window.release()
            await launcher
            await self.loop.run_in_executor(None, fill.commit)
            growing.finish()
        except BaseException as exc:
            launcher.cancel()
            for task in list(shard.tasks):
                task.cancel()
            fill.abort()
            growing.finish(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _in_thread(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(...)`` in a thread (cache locks block); a cached file or fill it returns
        after this producer was cancelled is closed or aborted, never leaked."""
        future = self.loop.run_in_executor(None, lambda: func(*args, **kwargs))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_orphan)
            raise


def _close_orphan(future: asyncio.Future[Any]) -> None:
    """A cache fill or cached file the cache gave a producer that was cancelled meanwhile:
    aborted or closed."""
    if future.cancelled() or future.exception() is not None:
        return
    orphan = future.result()
    if isinstance(orphan, CacheFill):
        orphan.abort()
    elif isinstance(orphan, CachedShard):
        orphan.close()
