"""Shard streams in order: remote shards as parallel ranged GETs running ahead, local shards in place.

Remote shards are those of any :class:`~shardstream.storage.base.RemoteStore` (S3, http(s), the
Hub, GCS, Azure); "S3" below stands for any of them. For remote shards one producer per
iterator runs on the process's background event loop (:mod:`shardstream.storage.loop`,
restarted after a fork, so DataLoader workers each get their own). It walks the shards in
reading order, up to ``max_inflight_shards`` ahead of the consumer, and cuts each into ranges
of ``part_bytes`` fetched by up to ``max_inflight_requests`` concurrent ranged GETs. Parts are
handed to the consumer in order as soon as each arrives, so the first sample is parsed while
the rest of its shard is still on the wire. Every byte fetched and not yet consumed counts
against ``max_buffer_bytes``; the producer waits when the budget is spent (backpressure), so
memory stays bounded however slow the consumer is.

Each part is checked against the others and the index: the same ETag (the object did not
change mid-read) and the size the index gives. A body cut off mid-transfer is fetched again
(:meth:`RemoteStore.get_range`).

With a :class:`~shardstream.storage.cache.ShardCache`, a shard found in the node-local cache is read
from local disk. A missing shard is *filled*: the producer takes the cache's per-shard lock
(without waiting) and a fill task downloads the whole shard into the cache file by itself, at
network speed, writing each part as it arrives (at most ``max_inflight_requests`` parts in
memory, outside ``max_buffer_bytes``); the consumer reads the file as it grows, and the fill
commits the entry when complete. A reader that wants only a byte range (a shard cut at a rank
or worker boundary) fills the whole shard too, starting at its range and wrapping around to
the head, which the reader of the other range will find in the cache. When another process
holds the shard's lock, the producer waits for its entry at most ``FetchConfig.cache_wait_s``
and then reads the shard from S3 without caching it (counted in ``stats().cache_waits`` / ``cache_bypasses``). Why this
cannot deadlock is argued in :mod:`shardstream.storage.cache`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..config import FetchConfig, S3Config
from ..errors import CorruptShardError, StorageConnectionError
from ..tarstream import Pieces, ReadStream
from . import loop as io_loop
from .base import Counters, is_remote_url, split_url
from .cache import BUSY
from .local import LocalStore
from .schemes import open_store

__all__ = ["iter_shard_streams"]

_END = object()


class _Hit:
    """The producer found the shard in the cache: read ``cached`` instead of parts."""

    def __init__(self, cached: Any) -> None:
        self.cached = cached


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _CacheWriteFailed(Exception):
    """The fill could not write to the cache any more (disk full or failing): the consumer
    reads the rest of the shard from S3."""


class _Growing:
    """A fill this process runs (module doc): how much of the shard is on disk, shared by the
    fill task on the loop thread and the consumer. The fill writes from ``start`` (where its
    consumer's byte range begins) to the end of the shard, then from 0 to ``start``; a consumer
    reads bytes ``start`` onwards as ``available`` says they arrive."""

    def __init__(self, fill: Any, reader: Any, start: int = 0) -> None:
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


class _Budget:
    """Bytes fetched and not yet consumed, at most ``limit_bytes`` (one part always fits)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._waiter: asyncio.Future[None] | None = None

    async def acquire(self, nbytes: int) -> None:
        while self.held_bytes and self.held_bytes + nbytes > self.limit_bytes:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self.held_bytes += nbytes

    def release(self, nbytes: int) -> None:  # on the loop thread
        self.held_bytes -= nbytes
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Shard:
    """One S3 shard's plan: its parts arrive in ``items`` in order, then ``_END``."""

    def __init__(
        self, url: str, store: Any, name: str, size_bytes: int | None, byte_range: tuple[int, int] | None = None
    ) -> None:
        self.url = url
        self.store = store
        self.name = name
        self.size_bytes = size_bytes
        self.byte_range = byte_range  # None: the whole shard
        self.etag: str | None = None
        self.items: queue.Queue[Any] = queue.Queue()
        self.tasks: set[asyncio.Task[list[bytes]]] = set()  # in flight only: a done task holds its part's bytes
        self.growing: _Growing | None = None
        self.waiting_on = "its turn: the reader is still fetching earlier shards (FetchConfig.max_inflight_shards)"


class _Producer:
    """Schedules the ranged GETs of a list of shards on the background loop (module doc)."""

    def __init__(self, shards: list[_Shard], fetch: FetchConfig, cache: Any, stats: Counters | None) -> None:
        self.shards = shards
        self.fetch = fetch
        self.cache = cache
        self.stats = stats
        self.loop = io_loop.get_loop()
        self.budget = _Budget(fetch.max_buffer_bytes)
        self.slots = asyncio.Semaphore(fetch.max_inflight_shards)
        self.requests = asyncio.Semaphore(fetch.max_inflight_requests)
        self.future = asyncio.run_coroutine_threadsafe(self._run(), self.loop)

    async def _run(self) -> None:
        for shard in self.shards:
            await self.slots.acquire()
            shard.waiting_on = f"{shard.store.label} ({shard.store.endpoint})"
            try:
                await self._schedule(shard)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
                shard.items.put(_Failure(exc))
                return

    async def _schedule(self, shard: _Shard) -> None:
        if self.cache is not None:
            if shard.size_bytes is None:
                shard.size_bytes, shard.etag = await shard.store.head(shard.name)
            cached = await self._in_thread(self.cache.open, shard.url, size_bytes=shard.size_bytes)
            if cached is None:  # a whole shard fills the cache, also when this reader wants a range of it
                claim = await self._claim(shard)
                if isinstance(claim, _Growing):
                    self._count("cache_misses", 1)
                    self._count("cache_fills", 1)
                    shard.growing = claim
                    shard.items.put(claim)
                    return
                cached = claim
            if cached is not None:
                self._count("cache_hits", 1)
                shard.items.put(_Hit(cached))
                return
            self._count("cache_misses", 1)
        if shard.size_bytes is None:
            shard.size_bytes, shard.etag = await shard.store.head(shard.name)
        first, last = shard.byte_range or (0, shard.size_bytes)
        if not 0 <= first <= last <= shard.size_bytes:
            raise ValueError(f"{shard.url}: byte range {first}-{last} is outside its {shard.size_bytes} bytes")
        ramp = shard is self.shards[0]
        for start, end in _part_ranges(first, last, self.fetch.part_bytes, ramp=ramp):
            shard.waiting_on = (
                "read-ahead room: parts fetched before it are not consumed yet (FetchConfig.max_buffer_bytes)"
            )
            await self.budget.acquire(end - start)
            self._gauge()
            shard.waiting_on = "a free request slot of this reader (FetchConfig.max_inflight_requests)"
            await self.requests.acquire()
            task = self._start_get(shard, start, end)
            item: concurrent.futures.Future[list[bytes]] = concurrent.futures.Future()
            task.add_done_callback(lambda t, item=item: _copy_outcome(t, item))
            shard.items.put((item, start, end))
        shard.waiting_on = f"{shard.store.label} ({shard.store.endpoint})"
        shard.items.put(_END)

    def _start_get(self, shard: _Shard, start: int, end: int) -> asyncio.Task[list[bytes]]:
        """A ranged GET as a task (holding one request slot, released when its body is in)."""
        task = asyncio.ensure_future(self._get(shard, start, end))
        shard.tasks.add(task)
        task.add_done_callback(shard.tasks.discard)
        return task

    async def _claim(self, shard: _Shard) -> Any:
        """After a cache miss: a :class:`_Growing` fill started here, a hit
        (another process filled it meanwhile), or None: read it from S3 without the cache (no
        room, or another process's fill did not finish within ``cache_wait_s``)."""
        assert self.cache is not None  # internal invariant: only with a cache
        deadline = self.loop.time() + self.fetch.cache_wait_s
        pause_s, waited = 0.005, False
        while True:
            fill = await self._in_thread(self.cache.fill, shard.url, size_bytes=shard.size_bytes, wait=False)
            if fill is not None and fill is not BUSY:
                if not fill.caching:  # no room: the rest is pinned or being filled
                    fill.abort()
                    self._count("cache_bypasses", 1)
                    return None
                growing = _Growing(fill, fill.reader(), start=shard.byte_range[0] if shard.byte_range else 0)
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

    async def _fill(self, shard: _Shard, growing: _Growing) -> None:
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
        ranges = [*_part_ranges(start, size, part, ramp=ramp), *_part_ranges(0, start, part, ramp=False)]

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
                    raise _CacheWriteFailed(f"{shard.url}: the node cache stopped taking its bytes (disk full?)")
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

    async def _get(self, shard: _Shard, start: int, end: int) -> list[bytes]:
        try:
            pieces, total, etag = await shard.store.get_range(
                shard.name, start, end, on_retry=lambda exc: self._count("retries", 1)
            )
        finally:
            self.requests.release()
        if total != shard.size_bytes:
            raise CorruptShardError(
                f"{shard.url}: is {total} bytes but the index says {shard.size_bytes}; the shard or "
                "its index is stale or damaged, re-pack or re-upload the dataset"
            )
        if shard.etag is None:
            shard.etag = etag
        elif etag != shard.etag:
            raise CorruptShardError(
                f"{shard.url}: changed while it was being read (ETag {shard.etag} then {etag}); "
                "do not overwrite shards of a dataset in use"
            )
        received = sum(map(len, pieces))
        if received != end - start:
            raise CorruptShardError(f"{shard.url}: bytes {start}-{end} came back as {received} bytes")
        return pieces

    async def _in_thread(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(...)`` in a thread (cache locks block); a cached file or fill it returns
        after this producer was cancelled is closed or aborted, never leaked."""
        future = self.loop.run_in_executor(None, lambda: func(*args, **kwargs))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_orphan)
            raise

    def _count(self, field: str, amount: int) -> None:
        if self.stats is not None:
            self.stats.add(field, amount)

    def _gauge(self) -> None:
        if self.stats is not None:
            self.stats.set("bytes_in_flight", self.budget.held_bytes)

    def release(self, nbytes: int) -> None:
        """Consumer side: ``nbytes`` of parts were consumed."""
        self.loop.call_soon_threadsafe(self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        self.budget.release(nbytes)
        self._gauge()

    def shard_done(self) -> None:
        """Consumer side: a shard was consumed; the producer may start one more."""
        self.loop.call_soon_threadsafe(self.slots.release)

    def cancel(self) -> None:
        """Stop scheduling and cancel every request (consumer side, on exit). Fills run on to
        their commit: they need no consumer, and other readers may be waiting for them."""
        self.future.cancel()

        def cancel_all() -> None:
            for shard in self.shards:
                if shard.growing is None:
                    for task in list(shard.tasks):
                        task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)


def _part_ranges(first: int, last: int, part_bytes: int, *, ramp: bool) -> Iterator[tuple[int, int]]:
    """``(start, end)`` byte ranges of the ranged GETs for bytes ``first`` to ``last`` of a
    shard. With ``ramp`` (the first shard a reader waits for) they start at ``part_bytes / 16``
    and double up to ``part_bytes``, so the first sample does not wait for a full part sharing
    the link with the others."""
    size = max(1, part_bytes // 16) if ramp else part_bytes
    start = first
    while start < last:
        end = min(start + size, last)
        yield start, end
        start, size = end, min(size * 2, part_bytes)


def _close_orphan(future: asyncio.Future[Any]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    orphan = future.result()
    for method in ("abort", "close"):
        if hasattr(orphan, method):
            getattr(orphan, method)()
            return


def _copy_outcome(task: asyncio.Task[list[bytes]], item: concurrent.futures.Future[list[bytes]]) -> None:
    if task.cancelled():
        item.cancel()
    elif task.exception() is not None:
        item.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        item.set_result(task.result())


class _SlicedStream:
    """``read(n)`` served by slicing the current chunk; subclasses ``_refill`` it (False at
    the end). One copy per payload, and no call below this class per member."""

    _chunk: bytes = b""
    _pos: int = 0

    def _refill(self) -> bool:
        raise NotImplementedError

    def read(self, n: int) -> bytes:
        end = self._pos + n
        if end <= len(self._chunk):
            out = self._chunk[self._pos : end]
            self._pos = end
            return out
        pieces = []
        while n > 0:
            available = len(self._chunk) - self._pos
            if available == 0:
                if not self._refill():
                    break
                continue
            take = min(available, n)
            pieces.append(self._chunk[self._pos : self._pos + take])
            self._pos += take
            n -= take
        return b"".join(pieces)

    def chunks(self) -> Iterator[bytes]:
        """The rest of the stream as its chunks, uncopied (for the tar parser; do not mix
        with ``read``). A chunk handed out is released when the next one is asked for."""
        if self._pos < len(self._chunk):
            yield self._chunk[self._pos :] if self._pos else self._chunk
        self._chunk, self._pos = b"", 0
        while self._refill():
            if self._chunk:
                yield self._chunk
        self._chunk, self._pos = b"", 0


class _PartStream(_SlicedStream):
    """``read(n)`` over a shard's parts as they arrive, each the pieces aiohttp received
    (sliced in place: one copy per payload)."""

    def __init__(self, shard: _Shard, producer: _Producer, stats: Counters | None, wait_s: float, first: Any) -> None:
        self._shard = shard
        self._pending = first
        self._producer = producer
        self._stats = stats
        self._wait_s = wait_s
        self._chunk = b""
        self._pos = 0
        self._held = 0
        self._part: list[bytes] = []  # the current part's pieces
        self._pieces: Iterator[bytes] = iter(())  # the rest of them
        self._eof = False

    def _refill(self) -> bool:
        while not self._eof:
            piece = next(self._pieces, None)
            if piece is not None:
                self._chunk, self._pos = piece, 0
                return True
            self._next_part()
        self._chunk, self._pos = b"", 0
        return False

    def groups(self) -> Iterator[Pieces]:
        """The stream as its parts, each the :class:`~shardstream.tarstream.Pieces` one
        ranged GET received (for a slicer; not to be mixed with ``read`` or ``chunks``). A
        part handed out is released when the next one is asked for."""
        while not self._eof:
            self._next_part()
            if not self._eof:
                yield Pieces(self._part)

    def _next_part(self) -> None:
        if self._held:
            self._producer.release(self._held)
            self._held = 0
        started = time.perf_counter()
        item = self._pending if self._pending is not None else _take(self._shard, self._wait_s)
        self._pending = None
        if item is _END:
            self._eof, self._part = True, []
        else:
            future, start, end = item
            self._held = end - start
            try:
                pieces = future.result(self._wait_s)
            except concurrent.futures.TimeoutError:
                raise _stalled(self._shard, self._wait_s, waiting_on=_get_wait(self._shard, start, end)) from None
            self._part, self._pieces = pieces, iter(pieces)
        if self._stats is not None:
            self._stats.add("stall_s", time.perf_counter() - started)

    def release(self) -> None:
        if self._held:
            self._producer.release(self._held)
            self._held = 0


class _GrowingStream(_SlicedStream):
    """``read(n)`` over the shard's bytes ``start`` to ``end`` in the cache file this process
    is filling (:class:`_Growing`), read as they arrive; if the fill cannot write any more, the
    rest comes from S3."""

    def __init__(
        self, shard: _Shard, growing: _Growing, stats: Counters | None, wait_s: float, chunk_bytes: int
    ) -> None:
        self._shard, self._growing, self._stats = shard, growing, stats
        self._wait_s, self._chunk_bytes = wait_s, chunk_bytes
        self._chunk = b""
        self._pos = 0
        self._offset, self._end = shard.byte_range or (0, shard.size_bytes or 0)  # next byte to read, last

    def _refill(self) -> bool:
        growing = self._growing
        started = time.perf_counter()
        if self._offset >= self._end:
            return False
        while self._offset >= growing.available:
            if growing.done:
                if growing.error is None:
                    return False
                if isinstance(growing.error, _CacheWriteFailed):
                    return self._refill_from_s3()
                raise growing.error
            if not growing.wait_beyond(self._offset, self._wait_s):
                raise _stalled(
                    self._shard,
                    self._wait_s,
                    waiting_on=(
                        f"this process's download of it into the node cache: {growing.available} of "
                        f"{self._shard.size_bytes} bytes have come from {self._shard.store.label} "
                        f"({self._shard.store.endpoint}) so far; {self._shard.store.pool_state()}"
                    ),
                )
        if self._stats is not None:
            self._stats.add("stall_s", time.perf_counter() - started)
        n = min(self._chunk_bytes, growing.available - self._offset, self._end - self._offset)
        self._chunk, self._pos = os.pread(growing.reader.fileno(), n, self._offset), 0
        self._offset += len(self._chunk)
        return bool(self._chunk)

    def _refill_from_s3(self) -> bool:
        shard = self._shard
        end = min(self._offset + self._chunk_bytes * 16, self._end)
        future = asyncio.run_coroutine_threadsafe(
            shard.store.get_range(shard.name, self._offset, end), io_loop.get_loop()
        )
        try:
            pieces, total, version = future.result(self._wait_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise _stalled(shard, self._wait_s, waiting_on=_get_wait(shard, self._offset, end)) from None
        if total != shard.size_bytes or (shard.etag is not None and version != shard.etag):
            raise CorruptShardError(
                f"{shard.url}: changed while it was being read (version {shard.etag}, {shard.size_bytes} bytes, "
                f"then {version}, {total} bytes); do not overwrite shards of a dataset in use"
            )
        self._chunk, self._pos = b"".join(pieces), 0
        self._offset += len(self._chunk)
        return bool(self._chunk)


class _ChunkedFile(_SlicedStream):
    """``read(n)`` over a local file read ``chunk_bytes`` at a time; only those reads are timed
    (as stall), so the per-member cost is a slice."""

    def __init__(self, f: Any, stats: Counters, chunk_bytes: int) -> None:
        self._f = f
        self._stats = stats
        self._chunk_bytes = chunk_bytes
        self._chunk = b""
        self._pos = 0

    def _refill(self) -> bool:
        started = time.perf_counter()
        self._chunk, self._pos = self._f.read(self._chunk_bytes), 0
        self._stats.add("stall_s", time.perf_counter() - started)
        return bool(self._chunk)


class _MappedFile:
    """A local shard (or cache entry) memory-mapped: the tar parser slices payloads straight
    out of the page cache, one copy each, where reading into a buffer first would make two.
    Page faults are not timed, so local reads add nothing to ``stall_s``.

    The file must not be truncated while mapped (the cache never does; it renames and
    unlinks). ``read(n)`` and ``chunks()`` are not to be mixed.
    """

    def __init__(self, f: Any, byte_range: tuple[int, int] | None = None) -> None:
        name = getattr(f, "name", None)
        self.path: str | None = os.fspath(name) if isinstance(name, (str, os.PathLike)) else None  # the file's
        self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            self._map.madvise(mmap.MADV_SEQUENTIAL)
        self._pos, self._end = byte_range or (0, len(self._map))

    def read(self, n: int) -> bytes:
        out = self._map[self._pos : min(self._pos + n, self._end)]
        self._pos += len(out)
        return out

    def chunks(self) -> Iterator[Any]:
        # The map slices to bytes like a bytes chunk does, so a whole file is handed on as is.
        if self._pos == 0 and self._end == len(self._map):
            yield self._map
        elif self._pos < self._end:
            yield _Window(self._map, self._pos, self._end)

    def close(self) -> None:
        self._map.close()


@contextlib.contextmanager
def _open_local(
    f: Any,
    url: str,
    size_bytes: int | None,
    stats: Counters | None,
    chunk_bytes: int,
    byte_range: tuple[int, int] | None = None,
) -> Iterator[Any]:
    """The stream of an open local file (bytes ``byte_range`` of it): memory-mapped, or read in
    chunks when it is empty (which cannot be mapped) or not a regular file."""
    actual = os.fstat(f.fileno()).st_size
    if size_bytes is not None and actual != size_bytes:
        # Raised when the stream is read, like a bad S3 part: the next shards stay readable.
        yield _Failing(
            CorruptShardError(
                f"{url}: is {actual} bytes but the index says {size_bytes}; the shard is truncated or "
                "was replaced, or its index is stale: re-pack or re-copy the dataset"
            )
        )
        return
    if byte_range is not None and not 0 <= byte_range[0] <= byte_range[1] <= actual:
        raise ValueError(f"{url}: byte range {byte_range[0]}-{byte_range[1]} is outside its {actual} bytes")
    try:
        mapped = _MappedFile(f, byte_range) if actual > 0 else None
    except (OSError, ValueError):
        mapped = None
    if mapped is None:
        if byte_range is not None:
            f.seek(byte_range[0])
            f = _Limited(f, byte_range[1] - byte_range[0])
        yield _ChunkedFile(f, stats, chunk_bytes) if stats is not None else f
        return
    try:
        yield mapped
    finally:
        mapped.close()


class _Window:
    """Bytes ``start`` to ``end`` of a map, sliced to ``bytes`` like a chunk (the parser only
    takes ``len`` and slices)."""

    __slots__ = ("_len", "_map", "_start")

    def __init__(self, mapped: mmap.mmap, start: int, end: int) -> None:
        self._map, self._start, self._len = mapped, start, end - start

    def __len__(self) -> int:
        return self._len

    def window(self) -> tuple[mmap.mmap, int, int]:
        """``(map, start, end)``: the map and where this window lies in it."""
        return self._map, self._start, self._start + self._len

    def __getitem__(self, key: slice) -> bytes:
        a, b, _ = key.indices(self._len)
        return self._map[self._start + a : self._start + max(a, b)]


class _Failing:
    """A stream whose first read raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def read(self, n: int) -> bytes:
        raise self._error

    def chunks(self) -> Iterator[bytes]:
        raise self._error
        yield b""  # a generator


class _Limited:
    """The next ``n`` bytes of a file."""

    def __init__(self, f: Any, n: int) -> None:
        self._f, self._left = f, n

    def read(self, n: int) -> bytes:
        out = self._f.read(min(n, self._left))
        self._left -= len(out)
        return out


def _take(shard: _Shard, wait_s: float) -> Any:
    try:
        item = shard.items.get(timeout=wait_s)
    except queue.Empty:
        raise _stalled(shard, wait_s) from None
    if isinstance(item, _Failure):
        raise item.exc
    return item


def _stalled(shard: _Shard, wait_s: float, *, waiting_on: str | None = None) -> StorageConnectionError:
    """The error of a reader that got no data for ``wait_s``, naming what it waited on: S3 (a
    GET, or a pooled connection), a slot of its own, or a download into the node cache."""
    return StorageConnectionError(
        f"{shard.url}: no data for {wait_s:.0f} s, waiting on {waiting_on or shard.waiting_on}"
    )


def _get_wait(shard: _Shard, start: int, end: int) -> str:
    return (
        f"{shard.store.label}: the GET of bytes {start}-{end} from {shard.store.endpoint} has not finished; "
        f"{shard.store.pool_state()}"
    )


def iter_shard_streams(
    urls: Sequence[str],
    *,
    sizes_bytes: Sequence[int | None] | None = None,
    byte_ranges: Sequence[tuple[int, int] | None] | None = None,
    s3: S3Config | None = None,
    fetch: FetchConfig | None = None,
    cache: Any = None,
    stats: Counters | None = None,
) -> Iterator[tuple[str, ReadStream]]:
    """Yield ``(url, stream)`` for each shard URL in order; ``stream.read(n)`` gives its bytes.

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
        cache: a :class:`~shardstream.storage.cache.ShardCache` for remote shards, or None.
        stats: counters to add stall time, cache hits/misses, retries and bytes in flight to.

    Raises:
        ShardNotFoundError: a shard does not exist (raised when its stream is read, for S3).
        CorruptShardError: an S3 shard's size differs from ``sizes_bytes``, or it changed
            while being read.
        StorageAccessError, StorageConnectionError, StorageError: S3 failures; a stall of
            more than ``max_attempts * (connect_timeout_s + read_timeout_s)`` raises
            StorageConnectionError rather than hanging.
    """
    fetch = fetch or FetchConfig()
    sizes = list(sizes_bytes) if sizes_bytes is not None else [None] * len(urls)
    if len(sizes) != len(urls):
        raise ValueError(f"{len(urls)} shard URLs but {len(sizes)} sizes")
    stores: dict[str, Any] = {}

    def store_and_name(url: str) -> tuple[Any, str]:
        root, name = split_url(url)
        if root not in stores:
            stores[root] = open_store(root or os.sep, s3=s3, fetch=fetch)
        return stores[root], name

    ranges = list(byte_ranges) if byte_ranges is not None else [None] * len(urls)
    if len(ranges) != len(urls):
        raise ValueError(f"{len(urls)} shard URLs but {len(ranges)} byte ranges")
    remote = [
        _Shard(url, *store_and_name(url), size, byte_range)
        for url, size, byte_range in zip(urls, sizes, ranges)
        if is_remote_url(url)
    ]
    producer = _Producer(remote, fetch, cache, stats) if remote else None
    next_remote = 0
    try:
        for url, size, byte_range in zip(urls, sizes, ranges):
            if not is_remote_url(url):
                store, name = store_and_name(url)
                if not isinstance(store, LocalStore):
                    raise TypeError(f"{url}: no reader for this store type")
                with (
                    store.open_read(name, buffer_bytes=0) as f,
                    _open_local(f, url, size, stats, fetch.chunk_bytes, byte_range) as stream,
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
    shard: _Shard, producer: _Producer, stats: Counters | None, *, wait_s: float, chunk_bytes: int
) -> Iterator[tuple[str, ReadStream]]:
    started = time.perf_counter()
    first = _take(shard, wait_s)
    if stats is not None:
        stats.add("stall_s", time.perf_counter() - started)
    if isinstance(first, _Hit):
        try:
            with _open_local(first.cached, shard.url, shard.size_bytes, stats, chunk_bytes, shard.byte_range) as stream:
                yield shard.url, stream
        finally:
            first.cached.close()
            producer.shard_done()
        return
    if isinstance(first, _Growing):
        try:
            yield shard.url, _GrowingStream(shard, first, stats, wait_s, chunk_bytes)
            if shard.byte_range is None:  # only the tail is left: let it commit before this iterator ends
                first.wait_done(wait_s)
        finally:
            first.reader.close()  # the fill goes on to its commit by itself
            producer.shard_done()
        return
    stream = _PartStream(shard, producer, stats, wait_s, first)
    try:
        yield shard.url, stream
    finally:
        stream.release()
        producer.shard_done()


def _stall_limit_s(shard: _Shard) -> float:
    """How long the consumer waits for data before calling the server stalled: one request's
    bound (all attempts), plus the wait for a free request slot."""
    return float(shard.store.request_limit_s)


def _discard(shard: _Shard) -> None:
    """After the consumer stopped: close cached files not read (a fill's own task, cancelled
    with the producer, drops its half-written entry)."""
    while True:
        try:
            item = shard.items.get_nowait()
        except queue.Empty:
            return
        if isinstance(item, _Hit):
            item.cached.close()
        elif isinstance(item, _Growing):
            item.reader.close()
