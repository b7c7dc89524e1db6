"""One entry of the node cache (:mod:`shardstream.storage.cache`, whose docstring gives the
layout, the locks and why processes sharing it cannot deadlock): a hit open for reading and
pinned (:class:`CachedShard`), a download into it (:class:`CacheFill`), and the ``flock``
helpers both use."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import CorruptShardError

__all__ = [
    "READ_BUFFER_BYTES",
    "WRITE_BUFFER_BYTES",
    "CacheFill",
    "CachedShard",
    "Flock",
    "close_quietly",
    "same_file",
    "try_flock",
]

READ_BUFFER_BYTES = 1 << 20
WRITE_BUFFER_BYTES = 1 << 20


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def try_flock(fd: int, operation: int) -> bool:
    """``flock(fd, operation | LOCK_NB)``; False when another descriptor holds a conflicting lock."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def same_file(fd: int, path: Path) -> bool:
    """True when ``path`` (not followed if a symlink) is still the regular file open as ``fd``."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


class Flock:
    """An open lock file holding an ``flock``; the lock goes when it is closed or collected."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            close_quietly(fd)  # closing the last descriptor of the open file releases the flock

    def __del__(self) -> None:
        self.close()


class CachedShard:
    """A cache hit: the entry, open for reading and pinned (shared ``flock``) until :meth:`close`.

    :meth:`read` returns fewer than ``n`` bytes only at the end of the shard. Use as a context
    manager, or call :meth:`close`; the pin also goes when the object is garbage collected.

    Attributes:
        url: the shard's URL.
        path: the entry file.
        size_bytes: the entry's size in bytes.
    """

    def __init__(self, url: str, path: Path, fd: int, size_bytes: int) -> None:
        self.url = url
        self.path = path
        self.size_bytes = size_bytes
        self._file = open(fd, "rb", buffering=READ_BUFFER_BYTES)  # noqa: SIM115 (owns fd and the pin)
        self._close_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CachedShard({self.url!r}, {str(self.path)!r}, size_bytes={self.size_bytes})"

    @property
    def closed(self) -> bool:
        return self._file.closed

    def fileno(self) -> int:
        return self._file.fileno()

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all the rest when ``n`` < 0); fewer only at the end."""
        return self._file.read(n)

    def readinto(self, buffer: bytearray | memoryview) -> int:
        return self._file.readinto(buffer)

    def seek(self, offset: int) -> int:
        return self._file.seek(offset)

    def close(self) -> None:
        """Close the file and drop the pin; the entry may be evicted afterwards. Idempotent."""
        with self._close_lock:
            self._file.close()

    def _pin(self) -> None:
        """Take the shared lock (the pin) now, unless closed: a fill's reader, at commit."""
        with self._close_lock:
            if not self._file.closed:
                try_flock(self._file.fileno(), fcntl.LOCK_SH)

    def __enter__(self) -> CachedShard:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CacheFill:
    """One download into the cache, returned by :meth:`ShardCache.fill`.

    Call :meth:`write` with the shard's bytes in order, then :meth:`commit`. When
    :attr:`caching` is False (no room could be made, or the disk failed while writing) the bytes
    are discarded and :meth:`commit` only checks the size; the caller still streams them to its
    consumer, so nothing is lost. :attr:`caching` can turn False during :meth:`write` (a fill of
    unknown size that outgrows the limit, a full disk), never back to True.

    As a context manager it aborts on *any* exit that did not commit, exception or not: it never
    commits on its own. :meth:`commit` and :meth:`abort` may be called in any order and more than
    once; only the first takes effect. Safe to share between threads.

    Attributes:
        url: the shard's URL.
        size_bytes: the size announced to :meth:`ShardCache.fill`, or None if unknown.
        caching: True while the bytes are going into the cache.
        bytes_written: bytes passed to :meth:`write` so far.
    """

    def __init__(
        self,
        cache: Any,  # the ShardCache that made it (not imported: cache.py imports this module)
        url: str,
        size_bytes: int | None,
        url_lock: Flock | None,
        partial_path: Path | None,
        partial_fd: int | None,
    ) -> None:
        self.url = url
        self.size_bytes = size_bytes
        self.bytes_written = 0
        self._cache = cache
        self._url_lock = url_lock
        self._partial_path = partial_path
        self._file = (
            open(partial_fd, "wb", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115 (closed at commit/abort)
            if partial_fd is not None
            else None
        )
        self.caching = self._file is not None
        self._done = False
        self._lock = threading.Lock()
        self._reader: CachedShard | None = None

    def __repr__(self) -> str:
        return f"CacheFill({self.url!r}, size_bytes={self.size_bytes}, caching={self.caching})"

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data``. A disk error drops the cached copy (:attr:`caching` turns False)
        instead of raising.

        Raises:
            ValueError: after commit or abort.
        """
        with self._lock:
            if self._done:
                raise ValueError(f"{self.url}: cache fill written after commit or abort")
            self.bytes_written += memoryview(data).nbytes
            if self._file is None:
                return
            if self.size_bytes is None and self.bytes_written > self._cache.cache_limit_bytes:
                self._stop_caching()  # can never fit: stop filling the disk
                return
            try:
                self._file.write(data)
            except OSError:
                self._stop_caching()

    def write_at(self, offset: int, pieces: list[bytes]) -> None:
        """Write ``pieces`` (contiguous) at byte ``offset``, unbuffered, so a :meth:`reader` sees
        them at once: parts of a known-size fill may be written in any order. A disk error drops
        the cached copy (:attr:`caching` turns False) instead of raising.

        Raises:
            ValueError: after commit or abort, or without ``size_bytes``.
        """
        with self._lock:
            if self._done or self.size_bytes is None:
                raise ValueError(f"{self.url}: write_at needs a live fill of known size")
            nbytes = sum(memoryview(piece).nbytes for piece in pieces)
            self.bytes_written += nbytes
            if self._file is None:
                return
            try:
                self._file.flush()  # what write() buffered goes first
                fd = self._file.fileno()
                for piece in pieces:
                    view = memoryview(piece).cast("B")
                    while view:
                        written = os.pwrite(fd, view, offset)
                        if written <= 0:
                            raise OSError(errno.ENOSPC, "no bytes written")
                        view, offset = view[written:], offset + written
            except OSError:
                self._stop_caching()

    def flush(self) -> None:
        """Push what :meth:`write` buffered to the file, so a :meth:`reader` sees it; a disk
        error drops the cached copy (:attr:`caching` turns False) instead of raising."""
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.flush()
            except OSError:
                self._stop_caching()

    def commit(self) -> None:
        """Finish: check the size, rename the partial file to the entry atomically, set its mtime
        to now, release the URL lock. Does nothing after commit or abort.

        Raises:
            CorruptShardError: ``size_bytes`` was given and a different number of bytes was
                written (the fill is aborted first).
            StorageError: the cache's global lock could not be had within ``lock_timeout_s``
                (the fill is aborted first).
        """
        with self._lock:
            if self._done:
                return
            if self.size_bytes is not None and self.bytes_written != self.size_bytes:
                self._finish()
                raise CorruptShardError(
                    f"{self.url}: expected {self.size_bytes} bytes but {self.bytes_written} were written "
                    "to the shard cache; the download was cut short or the shard changed, so it was not cached"
                )
            try:
                if self._file is not None:
                    self._commit_into_cache()
            finally:
                self._finish()

    def reader(self) -> CachedShard:
        """The file being filled, open for reading (``os.pread`` what :attr:`bytes_written`
        says is there): the filling process reads the shard from the disk while it arrives.
        It becomes a pinned reader of the entry at :meth:`commit`; close it when done.

        Raises:
            ValueError: the fill is not caching, or was committed or aborted.
        """
        with self._lock:
            if self._done or self._file is None or self._partial_path is None:
                raise ValueError(f"{self.url}: no cache file to read (not caching, or done)")
            if self._reader is None:
                fd = os.open(self._partial_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                self._reader = CachedShard(self.url, self._partial_path, fd, self.size_bytes or 0)
            return self._reader

    def abort(self) -> None:
        """Discard what was written and release the URL lock. Does nothing after commit or abort."""
        with self._lock:
            if not self._done:
                self._finish()

    def __enter__(self) -> CacheFill:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            self._finish()

    # internals; the caller holds self._lock

    def _commit_into_cache(self) -> None:
        assert self._file is not None and self._partial_path is not None  # internal: caching
        cache = self._cache
        try:
            self._file.flush()
        except OSError:
            self._stop_caching()
            return
        entry = cache.entry_path(self.url)
        with cache._global_lock(self.url):
            if self.size_bytes is None:  # nothing was reserved: make room now, or drop it
                scan = cache._scan(skip=self._partial_path)
                if not cache._make_room(scan, self.bytes_written, prefer=entry):
                    self._stop_caching()
                    return
            try:
                self._file.close()  # drops the partial's lock; safe under the global lock
                self._file = None
                if self._reader is not None:
                    self._reader._pin()  # pinned before the entry exists: never evicted while read
                os.replace(self._partial_path, entry)
                os.utime(entry)
            except OSError:
                self._stop_caching()
                return
        self._partial_path = None
        cache._count("fills")

    def _stop_caching(self) -> None:
        """Turn into a bypassing fill: drop the partial file and let other fillers go."""
        self._drop_partial()
        if self.caching:
            self.caching = False
            self._cache._count("bypassed")
        self._release_url_lock()

    def _drop_partial(self) -> None:
        """Close and unlink the partial file, if any (before the URL lock goes: no scan can
        misjudge it)."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        if self._partial_path is not None:
            self._partial_path.unlink(missing_ok=True)
            self._partial_path = None

    def _release_url_lock(self) -> None:
        if self._url_lock is not None:
            self._url_lock.close()
            self._url_lock = None

    def _finish(self) -> None:
        self._done = True
        self._drop_partial()
        self._release_url_lock()
