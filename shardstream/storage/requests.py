"""What the remote backends share beside their ranged reads (:mod:`.ranged`): the error of an
attempt worth another (:class:`Retryable`, what their error tables give for it), the count of
this process's requests in progress and the text that sets it against a connection pool (for
stall messages), ``Retry-After``, the per-process cache of library clients, the pieces of an
aiohttp body and the size of its socket reads, the Store methods of the bucket stores (GCS,
Azure), and the sink that uploads a shard in parts while it is written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import math
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

from ..config import FetchConfig
from ..errors import ShardNotFoundError, StorageConnectionError, StorageNotFoundError
from . import loop

__all__ = [
    "RECEIVE_BYTES",
    "BucketStoreMixin",
    "OpenRequests",
    "PartsSink",
    "PerProcess",
    "Retryable",
    "aiohttp_pieces",
    "content_range",
    "detach_finalizers",
    "final",
    "pool_state_text",
    "retry_after_s",
    "scrub",
]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class Retryable(StorageConnectionError):
    """A failed attempt worth another (a dropped or refused connection, a timeout, a 408, 429
    or 5xx answer): what a backend's error table gives for those, with the answer's
    ``Retry-After``. :mod:`.ranged`'s retry loop tries again; once no attempt is left it raises
    a plain StorageConnectionError saying so."""

    def __init__(self, message: str, *, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def final(error: BaseException) -> BaseException:
    """``error`` as raised to a caller: a :class:`Retryable` becomes a plain StorageConnectionError."""
    if isinstance(error, Retryable):
        plain = StorageConnectionError(str(error))
        plain.__cause__ = error.__cause__
        return plain
    return error


class OpenRequests:
    """Requests of this process in progress, each holding or waiting for a pooled connection
    (the loop thread counts; a forked child starts from none). ``with counter:`` counts one."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._count = 0

    def add(self, delta: int) -> None:
        if self._pid != os.getpid():
            self._pid, self._count = os.getpid(), 0
        self._count += delta

    def now(self) -> int:
        """The requests this process has open now."""
        return self._count if self._pid == os.getpid() else 0

    def __enter__(self) -> None:
        self.add(1)

    def __exit__(self, *exc_info: object) -> None:
        self.add(-1)


def pool_state_text(label: str, open_now: int, pool_size: int, knob_name: str) -> str:
    """How ``open_now`` requests of this process stand against ``pool_size`` pooled connections
    (``knob_name``: what sets that size), for stall messages."""
    if open_now > pool_size:
        return (
            f"this process has {open_now} {label} requests open for {pool_size} pooled connections "
            f"({knob_name}), so some wait for a connection other open iterators hold"
        )
    return f"the server stalls ({open_now} of {pool_size} pooled connections of this process in use)"


def retry_after_s(value: str | None, default_s: float, limit_s: float) -> float:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date), at most
    ``limit_s``; a garbage, nan or inf value is waited as none (``default_s``)."""
    seconds = default_s
    if value:
        try:
            seconds = float(value)
        except (TypeError, ValueError, OverflowError):
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError, OverflowError):
                seconds = default_s  # garbage: as if none came
    if not math.isfinite(seconds):
        seconds = default_s
    return min(max(seconds, 0.0), limit_s)


RECEIVE_BYTES = 2 << 20
"""The most bytes one read of a connection's socket takes (:func:`aiohttp_pieces`)."""
_ASYNCIO_RECEIVE_BYTES = 256 << 10  # what asyncio's socket transports take a read


async def aiohttp_pieces(response: Any) -> AsyncIterator[bytes]:
    """The pieces of an aiohttp ``response``'s body as they were received, without the copy
    that ``read(n)`` makes joining them: each piece is the body's bytes of one read of the
    socket.

    A read takes up to 256 KiB at first (asyncio's size), then twice as much each time one
    fills, up to :data:`RECEIVE_BYTES`, and half as much when one takes a quarter or less: a
    server that sends faster than the reader takes (nginx; S3 at node speed) leaves more than
    256 KiB waiting, and taking it at once means fewer turns of the event loop, parser calls
    and pieces a GB, while a slower one is read as before (docs/benchmarks.md). The size is
    kept with the pooled connection. Only asyncio's plain socket transports have it; a TLS
    connection or another event loop's transport (uvloop) reads as it does.

    The body's buffer holds up to two such reads before aiohttp stops reading the socket
    (``StreamReader.set_read_chunk_size``, where aiohttp has it: 3.14 does): at aiohttp's
    limit (512 KiB in 3.14) every wide read stopped and restarted the socket's reading (two
    ``epoll_ctl`` calls and their Python), a tenth of the reader's CPU over http. The pieces
    are taken as they come, so the buffer rarely holds any.
    """
    transport = getattr(getattr(response, "connection", None), "transport", None)
    if type(getattr(transport, "max_size", None)) is not int:
        transport = None
    content = response.content
    set_read_chunk_size = getattr(content, "set_read_chunk_size", None)
    if set_read_chunk_size is not None:
        set_read_chunk_size(RECEIVE_BYTES)  # stop reading at twice RECEIVE_BYTES held
    while True:
        piece, end_of_http_chunk = await content.readchunk()
        if piece:
            if transport is not None:
                size = transport.max_size
                if len(piece) >= size and size < RECEIVE_BYTES:
                    transport.max_size = min(2 * size, RECEIVE_BYTES)
                elif len(piece) <= size >> 2 and size > _ASYNCIO_RECEIVE_BYTES:
                    transport.max_size = max(size >> 1, _ASYNCIO_RECEIVE_BYTES)
            yield piece
        elif not end_of_http_chunk:  # (b"", False): the end of the body
            return


class PerProcess(Generic[K, V]):
    """This process's library clients (sessions, filesystems) by key, and a lock for making them
    on the background loop. A forked child starts with none: the parent's are kept alive
    (:func:`loop.keep_forked`) and never used, as those clients are not fork-safe."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._items: dict[K, V] = {}
        self._lock: asyncio.Lock | None = None

    def mine(self) -> dict[K, V]:
        if self._pid != os.getpid():
            for inherited in self._items.values():
                loop.keep_forked(inherited)
            self._items = {}
            self._pid, self._lock = os.getpid(), asyncio.Lock()
        return self._items

    def lock(self) -> asyncio.Lock:
        self.mine()
        assert self._lock is not None  # internal invariant, set by mine()
        return self._lock


class BucketStoreMixin:
    """What the bucket stores (S3, GCS, Azure) share beside :class:`~.ranged.RangedStore`: keys
    under ``prefix``, listing through ``_list_page``, small writes through ``_put``, the error
    table (the backend's ``translate`` with the store's endpoint), and one library operation
    bounded and translated by it."""

    url: str
    prefix: str
    endpoint: str
    request_limit_s: float
    # the backend's error table: (exc, *, url, endpoint, not_found) -> the error in the shardstream tree
    translate: Callable[..., BaseException]
    _put: Callable[..., Awaitable[bool]]
    # one page under a prefix: ([(key, size_bytes)], [folder keys], the next page's token or None)
    _list_page: Callable[..., Awaitable[tuple[list[tuple[str, int]], list[str], str | None]]]
    pool_state: Callable[[], str]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, endpoint={self.endpoint!r})"

    def error_table(
        self, exc: BaseException, *, url: str, not_found: type[StorageNotFoundError] = ShardNotFoundError
    ) -> BaseException:
        """``exc`` in the shardstream error tree, by the backend's table (``translate``)
        naming this store's endpoint."""
        return self.translate(exc, url=url, endpoint=self.endpoint, not_found=not_found)

    def key_of(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def list_names(self, prefix: str = "") -> list[str]:
        """Sorted names of the objects whose name starts with ``prefix``, page by page (folder
        placeholders, names ending in ``/``, are no files and are left out)."""
        root = self.key_of("")

        async def list_all() -> list[str]:
            names: list[str] = []
            token: str | None = None
            while True:
                files, _, token = await self._list_page(prefix, delimiter=False, token=token)
                names.extend(key[len(root) :] for key, _ in files)
                if not token:
                    return sorted(name for name in names if not name.endswith("/"))

        return loop.run(list_all())

    def list_dir(self, prefix: str) -> Iterator[tuple[str, int, bool]]:
        """One "directory" level under ``prefix`` (``""`` or ending in ``/``), page by page:
        ``(name, size_bytes, is_dir)`` with names relative to this store's prefix (a folder's
        own placeholder object is left out)."""
        root = self.key_of("")
        token: str | None = None
        while True:
            files, folders, token = loop.run(self._list_page(prefix, delimiter=True, token=token))
            for folder in folders:
                yield folder[len(root) :], 0, True
            for key, size in files:
                if key[len(root) :] != prefix:
                    yield key[len(root) :], size, False
            if not token:
                return

    def remove_empty_dirs(self, folders: tuple[str, ...]) -> None:
        """Nothing to do: buckets and containers have no directories."""

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write a small object in one request (published whole or not at all)."""
        loop.run(self._put(name, data, exclusive=False))

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Write ``name`` unless it exists; False when it already did."""
        return loop.run(self._put(name, data, exclusive=True))

    async def _run(
        self,
        operation: str,
        awaitable: Awaitable[T],
        *,
        url: str,
        not_found: type[StorageNotFoundError] = ShardNotFoundError,
    ) -> T:
        """Await one library operation (the library retries 429/5xx and dropped connections
        itself), bounded by ``request_limit_s``, translating its errors (``error_table``)."""
        limit_s = self.request_limit_s
        try:
            return await asyncio.wait_for(awaitable, limit_s)
        except asyncio.TimeoutError as exc:
            import aiohttp

            if isinstance(exc, aiohttp.ClientError):
                raise final(self.error_table(exc, url=url)) from exc
            raise StorageConnectionError(
                f"{url}: no answer from {self.endpoint} to {operation} within {limit_s:.0f} s: {self.pool_state()}"
            ) from None
        except Exception as exc:
            translated = final(self.error_table(exc, url=url, not_found=not_found))
            if translated is exc:  # ours already (or unknown): as raised, its chain as it was
                raise
            raise translated from exc


class PartsSink:
    """A shard uploaded in parts of ``fetch.upload_part_bytes`` while it is written, up to
    ``fetch.max_inflight_upload_parts`` in flight (S3's multipart upload, Azure's staged
    blocks): subclasses send a part (:meth:`_send_part`) and publish the whole (``commit``)."""

    def __init__(self, url: str, fetch: FetchConfig) -> None:
        self.url = url
        self._fetch = fetch
        self._buffer = bytearray()
        self._parts: list[concurrent.futures.Future[Any]] = []
        self._closed = False

    def write(self, data: bytes | memoryview) -> None:
        self._check_open("write")
        self._buffer += data
        if len(self._buffer) >= self._fetch.upload_part_bytes:
            self._send_part()

    def _send_part(self) -> None:
        """Send the buffer as the next part (its upload submitted to :meth:`_in_flight`)."""
        raise NotImplementedError

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise ValueError(f"{self.url}: {action} after commit or abort")

    def _in_flight(self, part: concurrent.futures.Future[Any]) -> None:
        """Keep ``part``'s upload; waits while more than ``max_inflight_upload_parts`` are in flight."""
        self._parts.append(part)
        pending = [f for f in self._parts if not f.done()]
        while len(pending) > self._fetch.max_inflight_upload_parts:
            pending.pop(0).result()

    def _drop_parts(self) -> bool:
        """Close the sink: cancel the parts in flight and wait for them, drop the buffer; False
        when it was closed already (abort is idempotent)."""
        if self._closed:
            return False
        self._closed = True
        for part in self._parts:
            part.cancel()
        concurrent.futures.wait(self._parts)
        self._buffer.clear()
        return True


# what a key, a SAS signature, a token or an upload session looks like in a library's message or URL
_SECRETS = re.compile(
    r"(?i)(accountkey=|sharedaccesssignature=|sig=|signature=|access_token=|token=|key=|upload_id=|bearer\s+)"
    r"[^\s;&'\"<]+"
)


def scrub(text: str) -> str:
    """``text`` without anything that looks like a key, a SAS signature, a token or an upload
    session id (each value replaced by ``***``): what every remote store does to a library's
    message before it goes into an error or a log line."""
    return _SECRETS.sub(lambda m: m.group(1) + "***", text)


def detach_finalizers(obj: object) -> None:
    """Drop the ``weakref.finalize`` hooks a library put on ``obj`` (or gave ``obj`` to): the
    stores close their clients on the loop at exit (:func:`loop.on_shutdown`), and a copy
    inherited by a forked child must never be closed (the hooks would close it with a blocking
    call on a loop that has stopped, or at the child's exit on the parent's loop)."""
    import weakref

    registry = getattr(weakref.finalize, "_registry", {})
    for finalizer in list(registry):
        info = finalizer.peek()
        if info is not None and (info[0] is obj or any(arg is obj for arg in info[2])):
            finalizer.detach()


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)-(-?\d+)/(\d+|\*)\s*")


def content_range(value: str) -> tuple[int, int, int | None]:
    """A ``Content-Range`` header: ``"bytes 10-19/100"`` -> ``(10, 19, 100)`` (first and last
    byte, the total or None for ``*``). The GCS emulator's ``"bytes 20-4/5"`` (past the end) and
    ``"bytes 0--1/0"`` (empty) parse as they are; the caller judges them.

    Raises:
        ValueError: not a byte range.
    """
    match = _CONTENT_RANGE.fullmatch(value)
    if match is None:
        raise ValueError(value)
    total = match.group(3)
    return int(match.group(1)), int(match.group(2)), (int(total) if total.isdigit() else None)
