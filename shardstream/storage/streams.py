"""The shard streams :func:`~shardstream.storage.fetch.iter_shard_streams` yields, each a
:class:`~shardstream.tarstream.ShardStream` (declared in :mod:`shardstream.tarstream`, the
layer the tar parser, the slicer and the reading engine share), implemented explicitly:

- a local shard or a cache entry, memory-mapped (:class:`MappedFile`, :func:`open_local`):
  the tar parser and the slicer slice payloads straight out of the page cache; read in chunks
  (:class:`ChunkedFile`) where it cannot be mapped;
- a remote shard's parts as the producer hands them on (:class:`PartStream`,
  :mod:`shardstream.storage.producer`), whose :meth:`~PartStream.groups` gives each ranged
  GET's body as one :class:`~shardstream.tarstream.Pieces`;
- a remote shard this process is filling into the node cache, read from the file as it grows
  (:class:`GrowingStream`, :mod:`shardstream.storage.fill`);
- a shard that fails when read (:class:`FailingStream`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import mmap
import os
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from ..errors import CorruptShardError
from ..tarstream import Chunk, Pieces, ShardStream, Window
from . import loop as io_loop
from .base import Counters
from .cache import CachedShard
from .fill import CacheWriteFailed, Growing
from .producer import END, Producer, RemoteShard, get_wait, stalled, take

__all__ = [
    "ChunkedFile",
    "FailingStream",
    "GrowingStream",
    "MappedFile",
    "PartStream",
    "ShardStream",
    "SlicedStream",
    "open_local",
]


class SlicedStream(ShardStream):
    """``read(n)`` served by slicing the current chunk; subclasses ``_refill`` it (False at
    the end). One copy per payload, and no call below this class per member. Its
    :meth:`groups` are its chunks; no file to read in place (``path`` None)."""

    path: str | None = None
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

    def groups(self) -> Iterator[Chunk | Pieces]:
        return self.chunks()


class PartStream(SlicedStream):
    """``read(n)`` over a shard's parts as they arrive, each the pieces aiohttp received
    (sliced in place: one copy per payload)."""

    def __init__(
        self, shard: RemoteShard, producer: Producer, stats: Counters | None, wait_s: float, first: Any
    ) -> None:
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
        item = self._pending if self._pending is not None else take(self._shard, self._wait_s)
        self._pending = None
        if item is END:
            self._eof, self._part = True, []
        else:
            future, start, end = item
            self._held = end - start
            try:
                pieces = future.result(self._wait_s)
            except concurrent.futures.TimeoutError:
                raise stalled(self._shard, self._wait_s, waiting_on=get_wait(self._shard, start, end)) from None
            self._part, self._pieces = pieces, iter(pieces)
        if self._stats is not None:
            self._stats.add("stall_s", time.perf_counter() - started)

    def release(self) -> None:
        if self._held:
            self._producer.release(self._held)
            self._held = 0


class GrowingStream(SlicedStream):
    """``read(n)`` over the shard's bytes ``start`` to ``end`` in the cache file this process
    is filling (:class:`Growing`), read as they arrive; if the fill cannot write any more, the
    rest comes from S3."""

    def __init__(
        self, shard: RemoteShard, growing: Growing, stats: Counters | None, wait_s: float, chunk_bytes: int
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
                if isinstance(growing.error, CacheWriteFailed):
                    return self._refill_from_s3()
                raise growing.error
            if not growing.wait_beyond(self._offset, self._wait_s):
                raise stalled(
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
            raise stalled(shard, self._wait_s, waiting_on=get_wait(shard, self._offset, end)) from None
        if total != shard.size_bytes or (shard.etag is not None and version != shard.etag):
            raise CorruptShardError(
                f"{shard.url}: changed while it was being read (version {shard.etag}, {shard.size_bytes} bytes, "
                f"then {version}, {total} bytes); do not overwrite shards of a dataset in use"
            )
        self._chunk, self._pos = b"".join(pieces), 0
        self._offset += len(self._chunk)
        return bool(self._chunk)


class ChunkedFile(SlicedStream):
    """``read(n)`` over a local file read ``chunk_bytes`` at a time; only those reads are timed
    (as stall, with ``stats``), so the per-member cost is a slice."""

    def __init__(self, f: BinaryIO | CachedShard | _Limited, stats: Counters | None, chunk_bytes: int) -> None:
        self._f = f
        self._stats = stats
        self._chunk_bytes = chunk_bytes
        self._chunk = b""
        self._pos = 0

    def _refill(self) -> bool:
        started = time.perf_counter()
        self._chunk, self._pos = self._f.read(self._chunk_bytes), 0
        if self._stats is not None:
            self._stats.add("stall_s", time.perf_counter() - started)
        return bool(self._chunk)


class MappedFile(ShardStream):
    """A local shard (or cache entry) memory-mapped: the tar parser slices payloads straight
    out of the page cache, one copy each, where reading into a buffer first would make two.
    Page faults are not timed, so local reads add nothing to ``stall_s``. ``path``: the
    file's, where it is a local shard read in place (:attr:`ShardStream.path`).

    The file must not be truncated while mapped (the cache never does; it renames and
    unlinks). ``read(n)`` and ``chunks()`` are not to be mixed.
    """

    def __init__(
        self, f: BinaryIO | CachedShard, byte_range: tuple[int, int] | None = None, *, path: str | None = None
    ) -> None:
        self.path = path
        self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            self._map.madvise(mmap.MADV_SEQUENTIAL)
        self._pos, self._end = byte_range or (0, len(self._map))

    def read(self, n: int) -> bytes:
        out = self._map[self._pos : min(self._pos + n, self._end)]
        self._pos += len(out)
        return out

    def chunks(self) -> Iterator[Chunk]:
        # The map slices to bytes like a bytes chunk does, so a whole file is handed on as is.
        if self._pos == 0 and self._end == len(self._map):
            yield self._map
        elif self._pos < self._end:
            yield Window(self._map, self._pos, self._end)

    def groups(self) -> Iterator[Chunk | Pieces]:
        return self.chunks()

    def close(self) -> None:
        self._map.close()


@contextlib.contextmanager
def open_local(
    f: BinaryIO | CachedShard,
    url: str,
    size_bytes: int | None,
    stats: Counters | None,
    chunk_bytes: int,
    byte_range: tuple[int, int] | None = None,
    *,
    path: str | None = None,
) -> Iterator[ShardStream]:
    """The stream of an open local file (bytes ``byte_range`` of it): memory-mapped, or read in
    chunks when it is empty (which cannot be mapped) or not a regular file. ``path``: the
    file's, for a local shard read in place (None for a cache entry)."""
    actual = os.fstat(f.fileno()).st_size
    if size_bytes is not None and actual != size_bytes:
        # Raised when the stream is read, like a bad S3 part: the next shards stay readable.
        yield FailingStream(
            CorruptShardError(
                f"{url}: is {actual} bytes but the index says {size_bytes}; the shard is truncated or "
                "was replaced, or its index is stale: re-pack or re-copy the dataset"
            )
        )
        return
    if byte_range is not None and not 0 <= byte_range[0] <= byte_range[1] <= actual:
        raise ValueError(f"{url}: byte range {byte_range[0]}-{byte_range[1]} is outside its {actual} bytes")
    try:
        mapped = MappedFile(f, byte_range, path=path) if actual > 0 else None
    except (OSError, ValueError):
        mapped = None
    if mapped is None:
        source: BinaryIO | CachedShard | _Limited = f
        if byte_range is not None:
            f.seek(byte_range[0])
            source = _Limited(f, byte_range[1] - byte_range[0])
        yield ChunkedFile(source, stats, chunk_bytes)
        return
    try:
        yield mapped
    finally:
        mapped.close()


class FailingStream(ShardStream):
    """A stream whose first read raises ``error``."""

    path: str | None = None

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def read(self, n: int) -> bytes:
        raise self._error

    def chunks(self) -> Iterator[Chunk]:
        raise self._error
        yield b""  # a generator

    def groups(self) -> Iterator[Chunk | Pieces]:
        return self.chunks()


class _Limited:
    """The next ``n`` bytes of a file."""

    def __init__(self, f: BinaryIO | CachedShard, n: int) -> None:
        self._f, self._left = f, n

    def read(self, n: int) -> bytes:
        out = self._f.read(min(n, self._left))
        self._left -= len(out)
        return out
