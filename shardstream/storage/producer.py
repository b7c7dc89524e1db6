"""The remote producer: a reader's remote shards fetched in order as parallel ranged GETs,
running ahead of the consumer within a memory bound.

Remote shards are those of any :class:`~shardstream.storage.base.RemoteStore` (S3, http(s), the
Hub, GCS, Azure); "S3" below stands for any of them. For remote shards one producer per
iterator runs on the process's background event loop (:mod:`shardstream.storage.loop`,
restarted after a fork, so DataLoader workers each get their own). It walks the shards in
reading order, up to ``max_inflight_shards`` ahead of the consumer, and cuts each into ranges
of ``part_bytes`` fetched by up to ``max_inflight_requests`` concurrent ranged GETs. Parts are
handed to the consumer in order as soon as each arrives, so the first sample is parsed while
the rest of its shard is still on the wire. Every byte fetched and not yet consumed counts
against ``max_buffer_bytes``; the producer waits when the budget is spent (backpressure), so
memory stays bounded however slow the consumer is. Readers that share one budget (a rank's
DataLoader workers, a mixture's sources, a reader's lanes) each get their part of it from
:func:`share_read_ahead`.

Each part is checked against the others and the index: the same ETag (the object did not
change mid-read) and the size the index gives. A body cut off mid-transfer is fetched again
(:meth:`RemoteStore.get_range`).

The consumer reads a shard's parts through
:class:`~shardstream.storage.streams.PartStream`; with a node cache the producer is a
:class:`~shardstream.storage.fill.CachingProducer`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import queue
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from ..config import FetchConfig
from ..errors import CorruptShardError, StorageConnectionError
from . import loop as io_loop
from .base import Counters

__all__ = [
    "END",
    "MIN_PART_BYTES",
    "Producer",
    "RemoteShard",
    "get_wait",
    "lane_fetch",
    "part_ranges",
    "share_buffer",
    "share_read_ahead",
    "source_fetch",
    "stalled",
    "take",
]

END = object()  # a shard's last item: its parts are all handed on
MIN_PART_BYTES = 1 << 20  # the smallest ranged GET a share of the read-ahead budget makes


class Failure:
    """An item that ends a shard: the producer failed with ``exc``, raised to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Budget:
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


class RemoteShard:
    """One S3 shard's plan: its parts arrive in ``items`` in order, then ``END``."""

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
        self.filling = False  # the node cache's fill of it runs (storage.fill), on by itself
        self.waiting_on = "its turn: the reader is still fetching earlier shards (FetchConfig.max_inflight_shards)"


class Producer:
    """Schedules the ranged GETs of a list of shards on the background loop (module doc)."""

    def __init__(self, shards: list[RemoteShard], fetch: FetchConfig, stats: Counters | None) -> None:
        self.shards = shards
        self.fetch = fetch
        self.stats = stats
        self.loop = io_loop.get_loop()
        self.budget = Budget(fetch.max_buffer_bytes)
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
                shard.items.put(Failure(exc))
                return

    async def _schedule(self, shard: RemoteShard) -> None:
        if await self._from_cache(shard):
            return
        if shard.size_bytes is None:
            shard.size_bytes, shard.etag = await shard.store.head(shard.name)
        first, last = shard.byte_range or (0, shard.size_bytes)
        if not 0 <= first <= last <= shard.size_bytes:
            raise ValueError(f"{shard.url}: byte range {first}-{last} is outside its {shard.size_bytes} bytes")
        ramp = shard is self.shards[0]
        for start, end in part_ranges(first, last, self.fetch.part_bytes, ramp=ramp):
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
            if ramp and start == first:  # the reader's first part has the link to itself
                await asyncio.wait([task])
        shard.waiting_on = f"{shard.store.label} ({shard.store.endpoint})"
        shard.items.put(END)

    def _start_get(self, shard: RemoteShard, start: int, end: int) -> asyncio.Task[list[bytes]]:
        """A ranged GET as a task (holding one request slot, released when its body is in)."""
        task = asyncio.ensure_future(self._get(shard, start, end))
        shard.tasks.add(task)
        task.add_done_callback(shard.tasks.discard)
        return task

    async def _from_cache(self, shard: RemoteShard) -> bool:
        """Hand the shard on from the node cache instead, if it can be (True); a
        :class:`~shardstream.storage.fill.CachingProducer` can. Here: False."""
        return False

    async def _get(self, shard: RemoteShard, start: int, end: int) -> list[bytes]:
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
                if not shard.filling:
                    for task in list(shard.tasks):
                        task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)


def part_ranges(first: int, last: int, part_bytes: int, *, ramp: bool) -> Iterator[tuple[int, int]]:
    """``(start, end)`` byte ranges of the ranged GETs for bytes ``first`` to ``last`` of a
    shard. With ``ramp`` (the first shard a reader waits for) they start at ``part_bytes / 64``
    (at least 64 KiB) and double up to ``part_bytes``, so the first sample does not wait for a
    full part; the producer sends that first GET alone, the others once it is in."""
    size = max(min(part_bytes, 64 << 10), part_bytes // 64) if ramp else part_bytes
    start = first
    while start < last:
        end = min(start + size, last)
        yield start, end
        start, size = end, min(size * 2, part_bytes)


def _copy_outcome(task: asyncio.Task[list[bytes]], item: concurrent.futures.Future[list[bytes]]) -> None:
    if task.cancelled():
        item.cancel()
    elif task.exception() is not None:
        item.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        item.set_result(task.result())


def take(shard: RemoteShard, wait_s: float) -> Any:
    """Consumer side: the shard's next item (at most ``wait_s``); a failure is raised."""
    try:
        item = shard.items.get(timeout=wait_s)
    except queue.Empty:
        raise stalled(shard, wait_s) from None
    if isinstance(item, Failure):
        raise item.exc
    return item


def stalled(shard: RemoteShard, wait_s: float, *, waiting_on: str | None = None) -> StorageConnectionError:
    """The error of a reader that got no data for ``wait_s``, naming what it waited on: S3 (a
    GET, or a pooled connection), a slot of its own, or a download into the node cache."""
    return StorageConnectionError(
        f"{shard.url}: no data for {wait_s:.0f} s, waiting on {waiting_on or shard.waiting_on}"
    )


def get_wait(shard: RemoteShard, start: int, end: int) -> str:
    """What a consumer waiting for bytes ``start`` to ``end`` of the shard waits on."""
    return (
        f"{shard.store.label}: the GET of bytes {start}-{end} from {shard.store.endpoint} has not finished; "
        f"{shard.store.pool_state()}"
    )


def share_read_ahead(
    fetch: FetchConfig, share: Fraction | float, *, requests: int | None = None, shards: int | None = None
) -> FetchConfig:
    """``fetch`` for one of several readers that share its read-ahead (the DataLoader workers
    of a rank, the sources of a mixture, the lanes of a reader): ``share`` of its
    ``max_buffer_bytes`` (rounded down), holding at least two ranged GETs (smaller ones, down to
    :data:`MIN_PART_BYTES`, where the share is small; the share grows to one such GET where it
    is smaller still), so the readers together keep to the budget. A share of 1 or more
    leaves the budget as it is. ``requests`` and ``shards``: the reader's
    ``max_inflight_requests`` and ``max_inflight_shards``, where they are cut too."""
    cut: dict[str, int] = {}
    if share < 1:
        budget = int(fetch.max_buffer_bytes * share)
        part = min(fetch.part_bytes, max(MIN_PART_BYTES, budget // 2))
        cut.update(part_bytes=part, max_buffer_bytes=max(part, budget))
    if requests is not None:
        cut["max_inflight_requests"] = requests
    if shards is not None:
        cut["max_inflight_shards"] = shards
    return dataclasses.replace(fetch, **cut) if cut else fetch


def lane_fetch(fetch: FetchConfig, lanes: int) -> FetchConfig:
    """``fetch`` for one of a reader's ``lanes`` (a reading engine's lanes of one plan): an
    equal part of its bytes, requests and shards in flight (each at least 1)."""
    if lanes <= 1:
        return fetch
    return share_read_ahead(
        fetch,
        Fraction(1, lanes),
        requests=max(1, fetch.max_inflight_requests // lanes),
        shards=max(1, fetch.max_inflight_shards // lanes),
    )


def source_fetch(fetch: FetchConfig, share: float) -> FetchConfig:
    """``fetch`` for a mixture's source that holds ``share`` of a worker's samples (the
    reading engine's ``read_mixed``): that part of its bytes and requests in flight (at least 1)."""
    return share_read_ahead(fetch, share, requests=max(1, round(fetch.max_inflight_requests * share)))


def share_buffer(fetch: FetchConfig, readers: int) -> FetchConfig:
    """``fetch`` for one of ``readers`` that share its ``max_buffer_bytes`` (a rank's
    DataLoader workers): each gets an equal part (:func:`share_read_ahead`)."""
    return share_read_ahead(fetch, Fraction(1, max(1, readers)))
