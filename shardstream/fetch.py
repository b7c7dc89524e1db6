"""Shard streams in order, with S3 downloads running ahead on the background loop.

Local shards are opened and read in place. S3 shards are downloaded by up to
``max_inflight_shards`` concurrent GETs: while the consumer parses shard *i*, shards
*i+1 ...* already stream into bounded queues, so at most
``max_inflight_shards * max_queued_chunks * chunk_bytes`` bytes are held. A download's error
is handed to the consumer and re-raised there; abandoning the iterator cancels the downloads.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
from collections.abc import Iterator, Sequence
from typing import Any

from .config import FetchConfig, S3Config
from .errors import StorageConnectionError
from .storage import LocalStore, is_s3_url, open_store, split_url
from .storage import loop as io_loop
from .tarstream import ReadStream

__all__ = ["iter_shard_streams"]

_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Download:
    """One S3 shard streaming into a bounded queue on the background loop."""

    def __init__(self, store: Any, name: str, fetch: FetchConfig) -> None:
        self.url = store.url_of(name)
        self.endpoint = store.endpoint
        self.stall_timeout_s = store.s3.connect_timeout_s + store.s3.read_timeout_s
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=fetch.max_queued_chunks)
        self.future = io_loop.submit(self._run(store, name, fetch.chunk_bytes))

    async def _run(self, store: Any, name: str, chunk_bytes: int) -> None:
        try:
            async for chunk in store.iter_chunks(name, chunk_bytes):
                await self.queue.put(chunk)
            await self.queue.put(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, raised there
            await self.queue.put(_Failure(exc))

    def next_chunk(self) -> Any:
        """The next chunk, ``_END``, or the download's error.

        Raises:
            StorageConnectionError: nothing arrived for ``connect_timeout_s +
                read_timeout_s`` (a stalled server, or every pooled connection held).
        """
        get = io_loop.submit(self.queue.get())
        try:
            item = get.result(self.stall_timeout_s)
        except concurrent.futures.TimeoutError:
            get.cancel()
            self.cancel()
            raise StorageConnectionError(
                f"{self.url}: no data from {self.endpoint} for {self.stall_timeout_s:.0f} s; the "
                "server stalls, or other open iterators hold every pooled connection "
                "(S3Config.max_pool_connections)"
            ) from None
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def cancel(self) -> None:
        self.future.cancel()


class _QueueStream:
    """``read(n)`` over the chunks of a :class:`_Download`; one copy per payload."""

    def __init__(self, download: _Download) -> None:
        self._download = download
        self._chunk = b""
        self._pos = 0
        self._eof = False

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
                if self._eof:
                    break
                chunk = self._download.next_chunk()
                if chunk is _END:
                    self._eof = True
                    break
                self._chunk, self._pos = chunk, 0
                continue
            take = min(available, n)
            pieces.append(self._chunk[self._pos : self._pos + take])
            self._pos += take
            n -= take
        return b"".join(pieces)


def iter_shard_streams(
    urls: Sequence[str], *, s3: S3Config | None = None, fetch: FetchConfig | None = None
) -> Iterator[tuple[str, ReadStream]]:
    """Yield ``(url, stream)`` for each shard URL in order.

    A stream is valid until the next item is requested. Local shards are opened in place;
    ``s3://`` shards are downloading ahead (module doc).

    Raises:
        ShardNotFoundError: a shard does not exist (raised when its stream is read, for S3).
        StorageAccessError, StorageConnectionError, StorageError: S3 failures.
    """
    fetch = fetch or FetchConfig()
    stores: dict[str, Any] = {}

    def store_and_name(url: str) -> tuple[Any, str]:
        root, name = split_url(url)
        if root not in stores:
            stores[root] = open_store(root or os.sep, s3=s3, fetch=fetch)
        return stores[root], name

    ahead: collections.deque[tuple[str, _Download]] = collections.deque()
    next_to_start = 0

    def start_downloads(position: int) -> None:
        nonlocal next_to_start
        next_to_start = max(next_to_start, position)
        while len(ahead) < fetch.max_inflight_shards and next_to_start < len(urls):
            url = urls[next_to_start]
            if not is_s3_url(url):
                break
            store, name = store_and_name(url)
            ahead.append((url, _Download(store, name, fetch)))
            next_to_start += 1

    try:
        for position, url in enumerate(urls):
            if is_s3_url(url):
                start_downloads(position)
                started_url, download = ahead.popleft()
                if started_url != url:  # internal invariant of start_downloads
                    raise RuntimeError(f"fetch order broken: expected {url}, got {started_url}")
                try:
                    yield url, _QueueStream(download)
                finally:
                    download.cancel()
                start_downloads(position + 1)
            else:
                store, name = store_and_name(url)
                if not isinstance(store, LocalStore):
                    raise TypeError(f"{url}: no reader for this store type")
                with store.open_read(name, buffer_bytes=fetch.chunk_bytes) as f:
                    yield url, f
    finally:
        for _, download in ahead:
            download.cancel()
