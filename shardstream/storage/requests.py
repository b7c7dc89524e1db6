"""What the remote backends share (:mod:`.s3`, :mod:`.http`, :mod:`.gcs`, :mod:`.azure`): the
count of this process's requests in progress and the text that sets it against a connection
pool (for stall messages), ``Retry-After``, the per-process cache of library clients, the Store
methods that read alike on every store governed by an :class:`~shardstream.config.HttpConfig`,
the pieces of an aiohttp body, and the sink that uploads a shard in parts while it is written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

from ..config import FetchConfig, HttpConfig
from ..errors import CorruptShardError, ShardNotFoundError, StorageConnectionError, StorageNotFoundError
from . import loop

__all__ = [
    "BucketStoreMixin",
    "OpenRequests",
    "PartsSink",
    "PerProcess",
    "RemoteStoreMixin",
    "aiohttp_pieces",
    "pool_state_text",
    "retry_after_s",
]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


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


async def aiohttp_pieces(content: Any) -> AsyncIterator[bytes]:
    """The pieces of an aiohttp body (``response.content``) as they were received, without the
    copy that ``read(n)`` makes joining them."""
    while True:
        piece, end_of_http_chunk = await content.readchunk()
        if piece:
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


class RemoteStoreMixin:
    """What the stores governed by an :class:`~shardstream.config.HttpConfig` (``http``) share:
    object URLs under ``url``, the bound of one request, and whole reads and existence by way
    of their ``head`` and ``get_range``."""

    url: str
    http: HttpConfig
    head: Callable[[str], Awaitable[tuple[int, str]]]
    get_range: Callable[[str, int, int | None], Awaitable[tuple[list[bytes], int, str]]]

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}" if name else self.url

    @property
    def request_limit_s(self) -> float:
        """Every attempt of one request with its waits (``HttpConfig.request_limit_s``); each
        request is cut off there."""
        return self.http.request_limit_s

    def exists(self, name: str) -> bool:
        try:
            loop.run(self.head(name))
        except ShardNotFoundError:
            return False
        return True

    def read_bytes(self, name: str) -> bytes:
        """The whole object; a body cut mid-transfer is resumed as :meth:`get_range` does."""
        return b"".join(loop.run(self.get_range(name, 0, None))[0])


class BucketStoreMixin(RemoteStoreMixin):
    """What the GCS and Azure stores share beside :class:`RemoteStoreMixin`: keys under
    ``prefix``, listing through ``_list_page``, small writes through ``_put``, one library
    operation bounded and translated (``_translate``, the module's), and the steps of a
    ranged read that name the object's version (``version_name``: "generation", "ETag")."""

    prefix: str
    endpoint: str
    version_name: str
    _translate: Callable[..., BaseException]
    _put: Callable[..., Awaitable[bool]]
    # one page under a prefix: ([(key, size_bytes)], [folder keys], the next page's token or None)
    _list_page: Callable[..., Awaitable[tuple[list[tuple[str, int]], list[str], str | None]]]
    pool_state: Callable[[], str]

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
        itself), bounded by :attr:`request_limit_s`, translating its errors (``_translate``)."""
        limit_s = self.request_limit_s
        try:
            return await asyncio.wait_for(awaitable, limit_s)
        except asyncio.TimeoutError as exc:
            import aiohttp

            if isinstance(exc, aiohttp.ClientError):
                raise self._translate(exc, url=url, endpoint=self.endpoint) from exc
            raise StorageConnectionError(
                f"{url}: no answer from {self.endpoint} to {operation} within {limit_s:.0f} s: {self.pool_state()}"
            ) from None
        except Exception as exc:
            translated = self._translate(exc, url=url, endpoint=self.endpoint, not_found=not_found)
            if translated is exc:  # ours already (or unknown): as raised, its chain as it was
                raise
            raise translated from exc

    def _changed(self, name: str, version: str, detail: str) -> CorruptShardError:
        return CorruptShardError(
            f"{self.url_of(name)}: changed while it was being read ({self.version_name} {version} {detail}); "
            "do not overwrite shards of a dataset in use"
        )

    def _ends_before(self, name: str, at: int, total: int | None) -> CorruptShardError:
        size = f" (it has {total} bytes)" if total is not None else ""
        return CorruptShardError(
            f"{self.url_of(name)}: ends before byte {at}{size}; the shard is shorter than its index says "
            "(stale index or truncated upload), re-pack or re-upload it"
        )

    async def _empty_range(self, name: str, start: int, version: str | None) -> tuple[list[bytes], int, str]:
        """The answer to a read of no bytes from ``start``: none, with the object's size and
        version, checked against ``version`` when given."""
        total, current = await self.head(name)
        if version is not None and current != version:
            raise self._changed(name, version, f"then {current}")
        if start > total:
            raise self._ends_before(name, start, total)
        return [], total, current

    async def _wait_to_retry(
        self,
        url: str,
        *,
        attempt: int,
        last: str,
        error: BaseException | None,
        retry_after: str | None,
        backoff_s: float,
        on_retry: Callable[[BaseException], None] | None,
    ) -> float:
        """After attempt ``attempt`` of a ranged read failed (``last`` says how): raises
        StorageConnectionError after the last, else tells ``on_retry`` and waits for the
        answer's ``Retry-After`` (or ``backoff_s``); returns the next backoff."""
        max_attempts = self.http.max_attempts
        if attempt == max_attempts:
            raise StorageConnectionError(
                f"{url}: no complete answer from {self.endpoint} after {max_attempts} attempts (last: {last}); "
                "check the network"
            ) from error
        if on_retry is not None and error is not None:
            on_retry(error)
        await asyncio.sleep(retry_after_s(retry_after, backoff_s, self.http.max_retry_after_s))
        return min(backoff_s * 2, 5.0)


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
