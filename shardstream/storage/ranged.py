"""The resumable ranged read and the one retry loop of every remote store (S3, http(s), the
Hub, GCS, Azure), under one :class:`~shardstream.config.RequestConfig`.

A backend supplies two things (and :class:`RangedStore` gives it the rest of the
:class:`~shardstream.storage.base.RemoteStore` reading methods):

- **one request function**, ``open_range(name, at, end, version)``: one request for bytes
  ``[at, end)`` (``end=None``: to the end), pinned to ``version`` when given (``If-Match``,
  ``generation=``), answering an :class:`Answer` (the object's size, the version the answer
  names, its body as pieces) or raising :class:`PastEnd` (the range starts past the end:
  HTTP 416, S3's ``InvalidRange``), :class:`Mismatch` (the pinned version no longer matches:
  HTTP 412) or the errors of its library;
- **one error table**, ``error_table(exc, url=, not_found=)``: its library's errors (and
  :class:`Status` answers) as :mod:`shardstream.errors`, a :class:`Retryable` for those worth
  another attempt (dropped or refused connections, timeouts, 408/429/5xx, with their
  ``Retry-After``).

What :func:`read_range` does with them, the same for every store:

- a body cut mid-transfer is asked for again from its first missing byte, so nothing received
  is fetched twice; every request after the first answer is pinned to that answer's version
  (or, for servers whose answers name none, to the version a metadata request gave before the
  first byte, compared again after the last);
- an answer naming another version or size, a 412, or the object gone while a version is
  pinned is :class:`~shardstream.errors.CorruptShardError` "changed while it was being read",
  never a mix of two versions;
- a range starting past the end (a 416) is an error ("ends before byte N"), unless it starts
  exactly at the end: that is an empty read.

And :func:`call` (one request, such as a HEAD, a listing or an upload part) and
:func:`read_range` retry alike (:class:`_Tries`): at most ``max_attempts`` attempts, each
bounded by ``connect_timeout_s + read_timeout_s`` (the wait for a pooled connection included:
aiohttp does not bound it), with a wait between them of the answer's ``Retry-After`` or a
backoff from 0.2 s doubling to 5 s, at most ``max_retry_after_s``; ``on_retry`` is told of each
retry. After the last attempt the last error is raised as a StorageConnectionError naming the
URL, the endpoint and the attempts.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..config import RequestConfig
from ..errors import (
    CorruptShardError,
    ShardNotFoundError,
    ShardstreamError,
    StorageConnectionError,
    StorageNotFoundError,
)
from . import loop
from .base import OnRetry
from .requests import OpenRequests, PerProcess, Retryable, pool_state_text, retry_after_s

__all__ = [
    "Answer",
    "Mismatch",
    "PastEnd",
    "RangedStore",
    "Retryable",
    "Status",
    "call",
    "read_range",
]

T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class Status(Exception):
    """An answer that is no success, from a backend that speaks HTTP itself (http(s), the Hub,
    GCS's downloads): for its error table to name."""

    def __init__(self, status: int, reason: str = "", *, retry_after: str | None = None, body: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status, self.reason, self.retry_after, self.body = status, reason, retry_after, body


class PastEnd(Exception):
    """The range asked for starts past the object's end (HTTP 416): with the object's size and
    version where the answer says them (None: ask the object's metadata)."""

    def __init__(self, total: int | None = None, version: str | None = None) -> None:
        super().__init__(f"range past the end ({total})")
        self.total, self.version = total, version


class Mismatch(Exception):
    """The version a request was pinned to no longer matches (HTTP 412)."""


@dataclass
class Answer:
    """An answer to a ranged request: the object's size, the version the answer names (None
    where it names none), the body's pieces, and how to let the response go."""

    total: int
    version: str | None
    pieces: AsyncIterator[bytes]
    close: Callable[[], Any]

    async def release(self) -> None:
        closed = self.close()
        if inspect.isawaitable(closed):
            await closed


_slots: PerProcess[tuple[str, str, int], asyncio.Semaphore] = PerProcess()


class RangedStore:
    """What every remote store reads alike: object URLs under ``url``, the request policy
    (``requests`` and the name of the knob that set it, for messages), whole reads, existence,
    and :meth:`get_range` by way of :func:`read_range` with the backend's ``open_range`` and
    ``error_table``.

    Class attributes a backend sets: ``label`` and ``version_name`` (the kind of store and of
    version, in messages), ``in_progress`` (its module's count of open requests),
    ``answers_name_version`` (False where answers name no version, so that a read pins one from
    ``head`` first), ``library_pool`` (True where the library keeps its own connection pool,
    whose size this store cannot set: ranged reads then take one of ``max_pool_connections``
    slots per process and endpoint instead).
    """

    url: str
    endpoint: str
    requests: RequestConfig
    knob = "RequestConfig"
    label = "remote"
    version_name = "version"
    in_progress = OpenRequests()
    answers_name_version = True
    library_pool = False

    head: Callable[[str], Awaitable[tuple[int, str]]]
    open_range: Callable[[str, int, int | None, str | None], Awaitable[Answer]]
    error_table: Callable[..., BaseException]

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}" if name else self.url

    @property
    def request_limit_s(self) -> float:
        """Every attempt of one request with the waits between them (``RequestConfig.request_limit_s``)."""
        return self.requests.request_limit_s

    def pool_state(self) -> str:
        return pool_state_text(
            self.label, self.in_progress.now(), self.requests.max_pool_connections, f"{self.knob}.max_pool_connections"
        )

    def exists(self, name: str) -> bool:
        try:
            loop.run(self.head(name))
        except ShardNotFoundError:
            return False
        return True

    def read_bytes(self, name: str) -> bytes:
        """The whole object; a body cut mid-transfer is resumed as :meth:`get_range` does."""
        return b"".join(loop.run(self.get_range(name, 0, None))[0])

    async def get_range(
        self, name: str, start: int, end: int | None, *, on_retry: OnRetry | None = None, version: str | None = None
    ) -> tuple[list[bytes], int, str]:
        """Bytes ``[start, end)`` of ``name`` (``end=None``: to its end) as the pieces they
        arrived in, with the object's size and version (:func:`read_range`; ``version``, when
        given, pins the first request too).

        Raises:
            ShardNotFoundError / BucketNotFoundError: no such object / bucket or container.
            CorruptShardError: ``start`` lies past the object's end, or it changed during the call.
            StorageAccessError; StorageConnectionError (still failing after ``max_attempts``
            attempts); StorageError (anything else, such as a server that ignores ``Range``).
        """
        return await read_range(self, name, start, end, version=version, on_retry=on_retry)

    def read_slots(self) -> asyncio.Semaphore | None:
        """This process's slots for ranged reads of this endpoint (stores with ``library_pool``), or None."""
        if not self.library_pool:
            return None
        key = (self.label, self.endpoint, self.requests.max_pool_connections)
        slots = _slots.mine()
        if key not in slots:
            slots[key] = asyncio.Semaphore(self.requests.max_pool_connections)
        return slots[key]


def changed(store: Any, url: str, version: str | None, detail: str) -> CorruptShardError:
    """The error of an object that changed while it was read (``detail``: what showed it)."""
    return CorruptShardError(
        f"{url}: changed while it was being read ({store.version_name} {version or '?'} {detail}); "
        "do not overwrite shards of a dataset in use"
    )


def ends_before(url: str, at: int, total: int | None) -> CorruptShardError:
    """The error of a read from byte ``at`` of an object of ``total`` bytes (``at`` > ``total``)."""
    size = f" (it has {total} bytes)" if total is not None else ""
    return CorruptShardError(
        f"{url}: ends before byte {at}{size}; the shard is shorter than its index says "
        "(stale index or truncated upload), re-pack or re-upload it"
    )


def _translated(store: Any, exc: BaseException, url: str, not_found: type[StorageNotFoundError]) -> BaseException:
    """``exc`` in the shardstream error tree: ours as raised, the library's by the store's table."""
    if isinstance(exc, ShardstreamError):
        return exc
    return store.error_table(exc, url=url, not_found=not_found)


class _Tries:
    """The retry loop's state for one request: after a failed attempt, :meth:`failed` raises
    (the error is final, or it was the last attempt) or tells ``on_retry`` and waits."""

    def __init__(self, store: Any, url: str, on_retry: OnRetry | None) -> None:
        self.store, self.url, self.on_retry = store, url, on_retry
        self.attempt = 0
        self.backoff_s = 0.2

    async def failed(self, error: BaseException, cause: BaseException) -> None:
        """After an attempt failed with ``cause``, ``error`` in the shardstream tree."""
        self.attempt += 1
        if not isinstance(error, Retryable):
            if error is cause:
                raise error
            raise error from cause
        policy: RequestConfig = self.store.requests
        if self.attempt >= policy.max_attempts:
            attempts = f"{policy.max_attempts} attempt{'s' if policy.max_attempts > 1 else ''}"
            raise StorageConnectionError(
                f"{error}; gave up after {attempts} ({self.store.knob}.max_attempts)"
            ) from cause
        if self.on_retry is not None:
            self.on_retry(error)
        await asyncio.sleep(retry_after_s(error.retry_after, self.backoff_s, policy.max_retry_after_s))
        self.backoff_s = min(self.backoff_s * 2, 5.0)


async def _bounded(store: Any, awaitable: Awaitable[T], *, url: str, operation: str) -> T:
    """Await one attempt, at most ``connect_timeout_s + read_timeout_s``: past that it is a
    :class:`Retryable` naming what this process's requests wait on."""
    limit_s = store.requests.attempt_limit_s
    try:
        return await asyncio.wait_for(awaitable, limit_s)
    except asyncio.TimeoutError as exc:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):  # aiohttp's own socket timeouts: the table names them
            raise
        raise Retryable(
            f"{url}: no answer from {store.endpoint} to {operation} within {limit_s:.0f} s: {store.pool_state()}"
        ) from None


async def call(
    store: Any,
    operation: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    url: str,
    not_found: type[StorageNotFoundError] = ShardNotFoundError,
    on_retry: OnRetry | None = None,
) -> T:
    """``attempt()`` (one request, ``operation`` in messages) until it answers, as the module
    doc says; its errors translated by ``store.error_table`` (``not_found``: the class a 404
    becomes)."""
    tries = _Tries(store, url, on_retry)
    while True:
        try:
            return await _bounded(store, attempt(), url=url, operation=operation)
        except Exception as exc:  # noqa: BLE001 - translated, then raised or tried again
            await tries.failed(_translated(store, exc, url, not_found), exc)


async def read_range(
    store: Any,
    name: str,
    start: int,
    end: int | None,
    *,
    version: str | None = None,
    on_retry: OnRetry | None = None,
) -> tuple[list[bytes], int, str]:
    """Bytes ``[start, end)`` of ``name`` (``end=None``: to its end) of ``store`` (a
    :class:`RangedStore`) as the pieces they arrived in, with the object's total size and
    version (module doc); ``version`` pins the first request too.

    Returns:
        ``(pieces, object_size_bytes, version)``; fewer bytes than asked only when the object
        ends before ``end``.
    """
    with store.in_progress:
        return await _read(store, name, start, end, version, on_retry)


async def _read(
    store: Any,
    name: str,
    start: int,
    end: int | None,
    pinned: str | None,
    on_retry: OnRetry | None,
) -> tuple[list[bytes], int, str]:
    url = store.url_of(name)
    if end is not None and end <= start:  # no bytes: the size and version say all
        total, current = await store.head(name)
        if pinned is not None and current != pinned:
            raise changed(store, url, pinned, f"then {current}")
        if start > total:
            raise ends_before(url, start, total)
        return [], total, current
    pieces: list[bytes] = []
    received = 0
    total: int | None = None
    if pinned is None and not store.answers_name_version:  # pin before the first byte, compare after the last
        total, pinned = await store.head(name)
    slots = store.read_slots()
    tries = _Tries(store, url, on_retry)
    while True:
        at = start + received
        held = False

        async def opened(at: int = at, pinned: str | None = pinned) -> Answer:
            nonlocal held
            if slots is not None:
                await slots.acquire()
                held = True
            return await store.open_range(name, at, end, pinned)

        try:
            answer = await _bounded(store, opened(), url=url, operation="a ranged GET")
            try:
                if answer.version is not None:
                    if pinned is not None and answer.version != pinned:
                        raise changed(store, url, pinned, f"then {answer.version} at byte {at}")
                    pinned = answer.version
                if total is not None and answer.total != total:
                    raise changed(store, url, pinned, f"now has {answer.total} bytes, the read began with {total}")
                total = answer.total
                if at > total:  # an answer from past the end (emulators; S3 and HTTP say 416)
                    raise ends_before(url, at, total)
                async for piece in answer.pieces:
                    pieces.append(piece)
                    received += len(piece)
            finally:
                await answer.release()
            break
        except PastEnd as past:
            size, current = past.total, past.version
            if size is None or current is None:
                size, current = await store.head(name)
            if pinned is not None and current != pinned:
                raise changed(store, url, pinned, f"then {current}") from None
            if at == size:  # from the end to the end: nothing
                return pieces, size, current
            raise ends_before(url, at, size) from None
        except Mismatch:
            raise changed(store, url, pinned, f"no longer matches at byte {at}") from None
        except Exception as exc:
            error = _translated(store, exc, url, ShardNotFoundError)
            if pinned is not None and type(error) is ShardNotFoundError and total is not None:
                _, current = await store.head(name)  # gone for good: head raises ShardNotFoundError
                raise changed(store, url, pinned, f"is gone at byte {at}, now {current}") from exc
            if isinstance(error, Retryable) and end is not None and received >= end - start:
                break  # all bytes are here; only the end of the answer was lost
            await tries.failed(error, exc)
        finally:
            if held:
                assert slots is not None  # internal invariant: held only with slots
                slots.release()
    assert total is not None  # internal invariant: set by the answer that ended the loop
    if not store.answers_name_version:  # no answer named its version: did it change meanwhile?
        size, current = await store.head(name)
        if current != pinned:
            raise changed(store, url, pinned, f"then {current}")
        if size != total:
            raise changed(store, url, pinned, f"now has {size} bytes, the read began with {total}")
    return pieces, total, pinned or ""
