"""Local directory storage: shards are read in place, written to a temporary name and renamed."""

from __future__ import annotations

import collections
import itertools
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from ..errors import CorruptShardError, DestinationError, ShardNotFoundError
from .base import OnRetry

__all__ = ["LocalStore"]

_PARTIAL = ".partial-"
_IOV_MAX = 1024


class LocalStore:
    """A local directory holding shards and an index.

    Args:
        root: the directory (created by :meth:`check_writable` when writing).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)

    def __repr__(self) -> str:
        return f"LocalStore({self.url!r})"

    def url_of(self, name: str) -> str:
        return str(self.root / name)

    def check_writable(self) -> None:
        """Create the directory if needed and prove a file can be written in it.

        Raises:
            DestinationError: it cannot be created, is not a directory, or is read-only.
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.root):
                pass
        except FileExistsError as exc:
            raise DestinationError(f"{self.root}: exists and is not a directory; pick another DEST") from exc
        except OSError as exc:
            raise DestinationError(
                f"{self.root}: cannot write here ({exc.strerror or exc}); pick a writable DEST or fix its permissions"
            ) from exc

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def open_read(self, name: str, *, buffer_bytes: int = 1 << 20) -> BinaryIO:
        """Open a shard for reading in place (no copy is made).

        Raises:
            ShardNotFoundError: there is no such file.
        """
        path = self.root / name
        try:
            return open(path, "rb", buffering=buffer_bytes)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ShardNotFoundError(
                f"{path}: no such shard file (check the path, or re-run shardstream pack)"
            ) from exc

    def read_bytes(self, name: str) -> bytes:
        with self.open_read(name) as f:
            return f.read()

    def _stat(self, name: str) -> os.stat_result:
        try:
            return os.stat(self.root / name)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ShardNotFoundError(f"{self.root / name}: no such file (check the path)") from exc

    async def head(self, name: str) -> tuple[int, str]:
        """``(size_bytes, version)`` of file ``name``; the version is its modification time and
        inode, which a replacement (a rename over it, as every writer here does) changes.

        Raises:
            ShardNotFoundError: no such file.
        """
        st = self._stat(name)
        return st.st_size, f"{st.st_mtime_ns:x}-{st.st_ino:x}"

    async def get_range(
        self, name: str, start: int, end: int | None, *, on_retry: OnRetry | None = None, version: str | None = None
    ) -> tuple[list[bytes], int, str]:
        """Bytes ``[start, end)`` of ``name`` as the remote stores give them (the same contract:
        :class:`~shardstream.storage.base.RemoteStore`); readers of local shards map or read
        the file in place instead.

        Raises:
            ShardNotFoundError: no such file; CorruptShardError: ``start`` lies beyond its end,
                or the file is not of ``version``.
        """
        with self.open_read(name, buffer_bytes=0) as f:
            st = os.fstat(f.fileno())
            current = f"{st.st_mtime_ns:x}-{st.st_ino:x}"
            if version is not None and current != version:
                raise CorruptShardError(
                    f"{self.root / name}: changed while it was being read (version {version} then {current}); "
                    "do not overwrite shards of a dataset in use"
                )
            if start > st.st_size:
                raise CorruptShardError(f"{self.root / name}: ends at byte {st.st_size}, before byte {start}")
            stop = st.st_size if end is None else min(end, st.st_size)
            data = os.pread(f.fileno(), max(stop - start, 0), start)
        return ([data] if data else []), st.st_size, current

    def write_bytes(self, name: str, data: bytes) -> None:
        sink = self.open_writer(name)
        try:
            sink.write(data)
            sink.commit()
        finally:
            sink.abort()

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Write ``name`` atomically unless it exists; False when it already did."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        sink = _LocalSink(path)
        try:
            sink.write(data)
            assert sink._file is not None  # internal: just written
            sink._file.close()
            sink._file = None
            try:
                os.link(sink.tmp_path, path)  # atomic, and fails if the name exists
            except FileExistsError:
                return False
            return True
        finally:
            sink.tmp_path.unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def list_names(self, prefix: str = "") -> list[str]:
        """Sorted names of the files under ``prefix`` (``"dir/"`` lists that subdirectory)."""
        folder, _, start = prefix.rpartition("/")
        base = self.root / folder if folder else self.root
        try:
            entries = [e.name for e in os.scandir(base) if e.is_file() and e.name.startswith(start)]
        except FileNotFoundError:
            return []
        return sorted(f"{folder}/{e}" if folder else e for e in entries)

    def remove_partials(self, is_mine: Callable[[str], bool], *, folders: tuple[str, ...] = ("",)) -> int:
        """Delete temporary files left by killed writers of the names ``is_mine`` accepts, in
        the top directory and the given subdirectories (names are relative to the root)."""
        removed = 0
        for folder in folders:
            try:
                entries = list(os.scandir(self.root / folder))
            except FileNotFoundError:
                continue
            for entry in entries:
                name, marker, _ = entry.name[1:].rpartition(_PARTIAL)
                if entry.name.startswith(".") and marker and is_mine(f"{folder}/{name}" if folder else name):
                    Path(entry.path).unlink(missing_ok=True)
                    removed += 1
        return removed

    def remove_empty_dirs(self, folders: tuple[str, ...]) -> None:
        """Remove these directories (relative to the root; "" is the root) where empty."""
        for folder in folders:
            try:
                (self.root / folder).rmdir()
            except OSError:  # not empty, or gone
                pass

    def open_writer(self, name: str) -> _LocalSink:
        path = self.root / name
        if path.parent != self.root:
            path.parent.mkdir(parents=True, exist_ok=True)
        return _LocalSink(path)


def _write_rest(fd: int, pieces: Sequence[bytes | memoryview], written: int) -> None:
    """Write what is left of ``pieces`` after a short ``writev`` of ``written`` bytes."""
    pending = collections.deque(memoryview(p) for p in pieces if len(p))  # an empty piece never goes out
    while pending:
        while written and pending:  # drop what went out; a short write resumes mid-piece
            if written >= len(pending[0]):
                written -= len(pending.popleft())
            else:
                pending[0] = pending[0][written:]
                written = 0
        if pending:
            written = os.writev(fd, list(itertools.islice(pending, _IOV_MAX)))


class _LocalSink:
    """Writes ``.NAME.partial-PID`` beside the target and renames it on commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp_path = path.with_name(f".{path.name}{_PARTIAL}{os.getpid()}")
        try:
            self._file: BinaryIO | None = open(self.tmp_path, "wb", buffering=0)  # noqa: SIM115 - closed at commit/abort
        except OSError as exc:
            raise DestinationError(f"{self.tmp_path}: cannot create ({exc.strerror or exc})") from exc

    def write(self, data: bytes | memoryview) -> None:
        self.write_many([data])  # the file is unbuffered: writev loops over short writes

    def write_many(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Write ``pieces`` in order with as few system calls as ``writev`` allows."""
        if self._file is None:
            raise ValueError(f"{self.path}: write after commit or abort")
        try:
            fd = self._file.fileno()
            for first in range(0, len(pieces), _IOV_MAX):
                run = pieces[first : first + _IOV_MAX]
                written = os.writev(fd, run)
                if written < sum(map(len, run)):  # a short write (a signal, a full disk): the rest in turn
                    _write_rest(fd, run, written)
        except OSError as exc:
            raise self._error(exc) from exc

    def commit(self) -> None:
        if self._file is None:
            raise ValueError(f"{self.path}: commit after commit or abort")
        try:
            self._file.close()
            self._file = None
            os.replace(self.tmp_path, self.path)
        except OSError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: OSError) -> DestinationError:
        return DestinationError(
            f"{self.path}: cannot write ({exc.strerror or exc}); free space on the disk or pick another DEST"
        )

    def abort(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:  # e.g. the disk is full: the partial file goes anyway
                pass
            self._file = None
        self.tmp_path.unlink(missing_ok=True)
