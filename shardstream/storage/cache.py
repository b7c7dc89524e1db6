"""A node-local cache of downloaded shards, shared by every process and thread of one node.

All ranks and DataLoader workers of a node point at one ``cache_dir``; each shard is
downloaded once per node and later epochs read it from local disk. Linux only (``fcntl.flock``).

Layout, all under ``<cache_dir>/shardstream-cache-v1/`` (the *root*)::

    <sha256(url)[:40]>.shard                       a complete entry; its mtime is its last use
    <sha256(url)[:40]>.<reserved>.<pid>.partial    a fill in progress, reserving <reserved> bytes
    locks/<sha256(url)[:40]>.lock                  the per-URL lock a filler holds while downloading
    .cache.lock                                    the global lock for accounting, eviction, renames

Locks (all ``flock``, which binds to an open file description, so every operation opens its
own descriptor and threads of one process exclude each other like processes do):

* a reader holds ``LOCK_SH`` on its entry for as long as its :class:`CachedShard` is open (the
  *pin*); eviction takes ``LOCK_EX | LOCK_NB`` on an entry and skips it when that fails;
* a filler holds ``LOCK_EX`` on ``locks/<hash>.lock`` from :meth:`ShardCache.fill` until commit
  or abort, so one process per node downloads a shard while the others wait for it (the
  fetcher's readers wait with a bound, see below);
* a filler holds ``LOCK_EX`` on its ``.partial`` file while it writes; a partial nobody holds a
  lock on was left by a dead process: it is deleted when seen and its reservation not counted;
* every unlink and rename of an entry, and every creation of a partial, happens under
  ``.cache.lock``, so the byte accounting is exact: entries + reservations <= the limit.

Only regular files whose names match the entry or partial patterns are ever deleted; anything
else in ``cache_dir`` or the root (and any symlink) is left alone.

Why processes sharing the cache cannot deadlock
-----------------------------------------------
The fetcher (:mod:`shardstream.storage.fetch`; its claims and fills are in
:mod:`shardstream.storage.fill`) uses the cache so that no wait of one process ever depends on
another process's consumer:

1. *A fill depends on nothing but S3 and the disk.* A process that gets a shard's URL lock
   downloads the whole shard into the ``.partial`` file by itself, at network speed, and
   commits it; its own consumer reads the file as it grows. Nothing in a fill waits for any
   consumer to take bytes (the disk absorbs them; the reservation bounds them), for another
   process, or for a lock other than the global one.
2. *The global lock is never held while waiting.* It guards only scans, renames, unlinks and
   the creation of partial files: each a few system calls on the local disk.
3. *A reader never blocks on another process's fill.* The fetcher asks for the URL lock
   without waiting (``fill(..., wait=False)``); if another process holds it, the reader polls
   for the committed entry for at most ``FetchConfig.cache_wait_s`` and then reads the shard
   from S3 itself, uncached (``stats().cache_waits`` / ``cache_bypasses``). By 1, that other
   fill is making progress anyway.
4. *Pins are shared locks only readers hold*, and eviction never waits for one (it skips
   pinned entries, ``LOCK_NB``).

So every cross-process wait is either bounded (3) or on a holder that does not wait at all (1, 2,
4): no cycle of waits can form, whatever order the processes read shards in. The old design
filled a shard only as fast as its consumer read it, and waited unboundedly for other
fillers: process A held shard X's lock while its consumer waited on shard Y, whose lock B held
while B's consumer waited on X. A process killed mid-fill loses its flocks with it; its
partial file is then unlocked, deleted by the next scan and its reservation no longer counted.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from ..errors import StorageError
from .cache_entry import CachedShard, CacheFill, Flock, close_quietly, same_file, try_flock

__all__ = ["BUSY", "Busy", "CacheFill", "CachedShard", "ShardCache"]

_ROOT_NAME = "shardstream-cache-v1"
_HASH_CHARS = 40
_ENTRY_RE = re.compile(rf"([0-9a-f]{{{_HASH_CHARS}}})\.shard")
_PARTIAL_RE = re.compile(rf"([0-9a-f]{{{_HASH_CHARS}}})\.(\d+)\.(\d+)\.partial")
_POLL_FIRST_S = 0.001
_POLL_MAX_S = 0.05
_OPEN_RETRIES = 4
_STAT_NAMES = ("hits", "misses", "fills", "evictions", "evicted_bytes", "bypassed")


class Busy:
    """The type of :data:`BUSY`: another process or thread is filling that URL now."""

    def __repr__(self) -> str:
        return "BUSY"


BUSY = Busy()


def _url_hash(url: str) -> str:
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:_HASH_CHARS]


@dataclass
class _Scan:
    """What is in the root now: entries as (mtime_ns, size_bytes, path), and live reservations."""

    entries: list[tuple[int, int, Path]]
    reserved_bytes: int

    @property
    def used_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries) + self.reserved_bytes


class ShardCache:
    """A directory of downloaded shards shared by all processes of one node, with LRU eviction.

    Args:
        cache_dir: where to keep the cache; entries live only in ``cache_dir/shardstream-cache-v1``,
            which is created. Put it on a local disk (``flock`` must work there).
        cache_limit_bytes: the most bytes the entries plus the fills in progress may take.
        lock_timeout_s: seconds :meth:`fill` waits for another process downloading the same shard
            (and any operation waits for the cache's global lock) before raising.

    Raises:
        ValueError: ``cache_limit_bytes`` < 1 or ``lock_timeout_s`` < 0.
        StorageError: the cache directory cannot be created.

    The cache object holds no open files, so it may be created before DataLoader workers fork;
    :meth:`stats` counts per process (a forked child starts from zero).
    """

    def __init__(
        self, cache_dir: str | os.PathLike[str], *, cache_limit_bytes: int, lock_timeout_s: float = 600.0
    ) -> None:
        if cache_limit_bytes < 1:
            raise ValueError(f"cache_limit_bytes must be at least 1, got {cache_limit_bytes}")
        if lock_timeout_s < 0:
            raise ValueError(f"lock_timeout_s must be >= 0, got {lock_timeout_s}")
        self.cache_dir = Path(cache_dir).expanduser().absolute()
        self.root = self.cache_dir / _ROOT_NAME
        self.cache_limit_bytes = cache_limit_bytes
        self.lock_timeout_s = lock_timeout_s
        self._locks_dir = self.root / "locks"
        self._global_lock_path = self.root / ".cache.lock"
        try:
            self._locks_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"{self.root}: cannot create the shard cache directory ({exc.strerror or exc}); "
                "pick a writable local cache_dir"
            ) from exc
        self._stats_lock = threading.Lock()
        self._stats_pid = os.getpid()
        self._stats = dict.fromkeys(_STAT_NAMES, 0)

    def __repr__(self) -> str:
        return f"ShardCache({str(self.cache_dir)!r}, cache_limit_bytes={self.cache_limit_bytes})"

    def entry_path(self, url: str) -> Path:
        """``<root>/<sha256(url) hex[:40]>.shard``."""
        return self.root / f"{_url_hash(url)}.shard"

    def open(self, url: str, *, size_bytes: int | None = None) -> CachedShard | None:
        """The entry for ``url`` opened and pinned, with its mtime set to now; None on a miss.

        An entry whose size differs from ``size_bytes`` (when given) is stale: it is removed
        unless another reader has it open, and the call is a miss.
        """
        path = self.entry_path(url)
        for _ in range(_OPEN_RETRIES):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except (FileNotFoundError, OSError):  # absent, or a symlink (ELOOP): not ours
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an evictor unlinks it
                if not same_file(fd, path):  # evicted or replaced between open and lock
                    close_quietly(fd)
                    continue
                held_bytes = os.fstat(fd).st_size
                if size_bytes is not None and held_bytes != size_bytes:
                    identity = os.fstat(fd)
                    close_quietly(fd)
                    self._remove_stale(path, (identity.st_dev, identity.st_ino), url)
                    break
                try:
                    os.utime(fd)
                except OSError:  # e.g. another user's entry: LRU order is only a hint
                    pass
                shard = CachedShard(url, path, fd, held_bytes)
            except BaseException:
                close_quietly(fd)
                raise
            self._count("hits")
            return shard
        self._count("misses")
        return None

    def fill(self, url: str, *, size_bytes: int | None, wait: bool = True) -> CacheFill | Busy | None:
        """Start downloading ``url`` into the cache, after a miss of :meth:`open`.

        Waits (up to ``lock_timeout_s``) while another process or thread fills the same URL;
        with ``wait=False`` returns :data:`BUSY` at once instead (the fetcher waits on its own
        terms, see the module doc). Returns None when the entry exists by then: call
        :meth:`open` again. Otherwise returns a
        :class:`CacheFill`; its ``caching`` is False when no room can be made (``size_bytes`` over
        the limit, or the rest is pinned or being filled), and then other fillers are not held up.
        ``size_bytes`` None reserves nothing now and makes room at commit.

        Raises:
            ValueError: ``size_bytes`` < 0.
            StorageError: the wait for the URL's lock or the global lock timed out.
        """
        if size_bytes is not None and size_bytes < 0:
            raise ValueError(f"{url}: size_bytes must be >= 0, got {size_bytes}")
        digest = _url_hash(url)
        entry = self.root / f"{digest}.shard"
        url_lock = self._acquire(
            self._locks_dir / f"{digest}.lock", url, what="another download of it", timeout_s=None if wait else 0.0
        )
        if url_lock is None:
            return BUSY
        try:
            try:
                existing = os.lstat(entry)
            except FileNotFoundError:
                existing = None
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                url_lock.close()  # something we did not create has the entry's name: leave it alone
                return self._bypass(url, size_bytes)
            if existing is not None and (size_bytes is None or existing.st_size == size_bytes):
                url_lock.close()
                return None  # filled while we waited
            if size_bytes is not None and size_bytes > self.cache_limit_bytes:
                url_lock.close()
                return self._bypass(url, size_bytes)
            reserved = size_bytes or 0
            partial = self.root / f"{digest}.{reserved}.{os.getpid()}.partial"
            with self._global_lock(url):
                scan = self._scan()
                if not self._make_room(scan, reserved, prefer=entry):
                    url_lock.close()
                    return self._bypass(url, size_bytes)
                fd = self._create_partial(partial)
                if fd is None:
                    url_lock.close()
                    return self._bypass(url, size_bytes)
            return CacheFill(self, url, size_bytes, url_lock, partial, fd)
        except BaseException:
            url_lock.close()
            raise

    def stats(self) -> dict[str, int]:
        """This process's counts: hits, misses, fills (entries committed), evictions,
        evicted_bytes, bypassed (fills whose bytes were not cached)."""
        with self._stats_lock:
            self._reset_after_fork()
            return dict(self._stats)

    def used_bytes(self) -> int:
        """Bytes in complete entries now (fills in progress not included)."""
        return sum(size for _, size, _ in self._scan_entries())

    # internals

    def _count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self._reset_after_fork()
            self._stats[name] += amount

    def _reset_after_fork(self) -> None:
        if self._stats_pid != os.getpid():
            self._stats_pid = os.getpid()
            self._stats = dict.fromkeys(_STAT_NAMES, 0)

    def _bypass(self, url: str, size_bytes: int | None) -> CacheFill:
        self._count("bypassed")
        return CacheFill(self, url, size_bytes, None, None, None)

    @overload
    def _acquire(self, lock_path: Path, url: str, *, what: str) -> Flock: ...

    @overload
    def _acquire(self, lock_path: Path, url: str, *, what: str, timeout_s: float | None) -> Flock | None: ...

    def _acquire(self, lock_path: Path, url: str, *, what: str, timeout_s: float | None = None) -> Flock | None:
        """Open ``lock_path`` and take ``LOCK_EX``, polling so ``lock_timeout_s`` is honoured.
        With ``timeout_s=0``: one try, None if the lock is held.

        Raises:
            StorageError: the lock file cannot be opened, or the lock was not had in time.
        """
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise StorageError(
                f"{url}: cannot open the shard cache lock {lock_path} ({exc.strerror or exc}); "
                f"check that the cache_dir {self.cache_dir} is writable"
            ) from exc
        lock = Flock(fd)
        if timeout_s == 0:
            if try_flock(fd, fcntl.LOCK_EX):
                return lock
            lock.close()
            return None
        deadline = time.monotonic() + self.lock_timeout_s
        pause_s = _POLL_FIRST_S
        while not try_flock(fd, fcntl.LOCK_EX):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                lock.close()
                raise StorageError(
                    f"{url}: timed out after {self.lock_timeout_s:g} s waiting for {what} in the shard cache "
                    f"{self.root}; a process on this node may be stuck: stop it, raise lock_timeout_s, "
                    "or use another cache_dir"
                )
            time.sleep(min(pause_s, remaining_s))
            pause_s = min(pause_s * 2, _POLL_MAX_S)
        return lock

    @contextmanager
    def _global_lock(self, url: str) -> Iterator[None]:
        lock = self._acquire(self._global_lock_path, url, what="the cache's global lock")
        try:
            yield
        finally:
            lock.close()

    def _scan_entries(self) -> list[tuple[int, int, Path]]:
        entries = []
        for item in os.scandir(self.root):
            if _ENTRY_RE.fullmatch(item.name):
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    entries.append((st.st_mtime_ns, st.st_size, Path(item.path)))
        return entries

    def _scan(self, *, skip: Path | None = None) -> _Scan:
        """Entries and live reservations; deletes partial files of dead fillers. Caller holds
        the global lock."""
        reserved_bytes = 0
        for item in os.scandir(self.root):
            match = _PARTIAL_RE.fullmatch(item.name)
            if match is None or Path(item.path) == skip:
                continue
            if self._remove_if_unlocked(Path(item.path)):
                continue
            reserved_bytes += int(match.group(2))
        return _Scan(self._scan_entries(), reserved_bytes)

    def _remove_if_unlocked(self, path: Path) -> bool:
        """Delete the regular file ``path`` unless someone holds an flock on it; True if gone."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return True
        except OSError:  # a symlink or unreadable: not ours to judge
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            if not try_flock(fd, fcntl.LOCK_EX):
                return False
            if same_file(fd, path):
                path.unlink()
            return True
        finally:
            close_quietly(fd)

    def _make_room(self, scan: _Scan, needed_bytes: int, *, prefer: Path) -> bool:
        """Evict unpinned entries, ``prefer`` (this URL's stale entry) first and then the least
        recently used, until ``needed_bytes`` more fit. False if they cannot. Caller holds the
        global lock."""
        used_bytes = scan.used_bytes
        if needed_bytes > self.cache_limit_bytes:
            return False
        candidates = sorted(scan.entries, key=lambda e: (e[2] != prefer, e[0], e[2].name))
        for _, size, path in candidates:
            if used_bytes + needed_bytes <= self.cache_limit_bytes:
                break
            if self._remove_if_unlocked(path):
                used_bytes -= size
                if path != prefer:
                    self._count("evictions")
                    self._count("evicted_bytes", size)
        return used_bytes + needed_bytes <= self.cache_limit_bytes

    def _remove_stale(self, path: Path, identity: tuple[int, int], url: str) -> None:
        """Remove the entry at ``path`` if it is still the file ``identity`` and nobody pins it."""
        with self._global_lock(url):
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) == identity:
                self._remove_if_unlocked(path)

    def _create_partial(self, path: Path) -> int | None:
        """Create and lock ``path`` exclusively; None if that fails. Caller holds the global lock."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o666)
        except FileExistsError:  # our pid's leftover from a fill that was never closed
            if not self._remove_if_unlocked(path):
                return None
            try:
                fd = os.open(path, flags, 0o666)
            except OSError:
                return None
        except OSError:
            return None
        if not try_flock(fd, fcntl.LOCK_EX):  # cannot happen: it is new and we hold the global lock
            close_quietly(fd)
            path.unlink(missing_ok=True)
            return None
        return fd
