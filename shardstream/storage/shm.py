"""Small shared-memory files that a dataset in the training process shares with its DataLoader
workers, forked or spawned, persistent or not: the reading metrics
(:mod:`shardstream.reading.stats`) and the epoch of each pass (:mod:`shardstream.reading.epochs`).

The training process creates the file (in ``/dev/shm`` when it exists, else the temporary
directory) and removes it when the creating object is garbage-collected or the process exits.
A process killed by SIGKILL cannot; the next file made with the same prefix removes the files
whose creating process is gone.
A forked worker inherits the mapping; a spawned one re-opens the file by path after
unpickling. :meth:`SharedFile.lock` serialises updates that span several values, across
processes (``flock`` on a descriptor opened for that call, so a fork never shares it).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import tempfile
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

__all__ = ["SharedFile"]


class SharedFile:
    """A zero-filled file of ``num_bytes`` mapped into every process that uses it.

    Args:
        prefix: the file name's start, e.g. ``"shardstream-stats"``.
        num_bytes: its size (a sparse file: pages take memory only once written).
    """

    def __init__(self, prefix: str, num_bytes: int) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        _remove_orphans(Path(folder), prefix)
        self.path = str(Path(folder) / f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        self.num_bytes = num_bytes
        with open(self.path, "wb") as f:
            f.truncate(num_bytes)
        self._owner_pid = os.getpid()
        self._map: mmap.mmap | None = None
        weakref.finalize(self, _remove, self.path, self._owner_pid)

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "num_bytes": self.num_bytes, "_owner_pid": self._owner_pid, "_map": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    def buffer(self) -> mmap.mmap | None:
        """The mapping (writable, shared); None if the file is gone (its owner exited)."""
        if self._map is None:
            try:
                with open(self.path, "r+b") as f:
                    self._map = mmap.mmap(f.fileno(), self.num_bytes)
            except (FileNotFoundError, ValueError):
                return None
        return self._map

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the file's exclusive lock (every process using the file) for the block; a
        no-op if the file is gone."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below, which releases the lock
        except FileNotFoundError:
            yield
            return
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield


def _remove_orphans(folder: Path, prefix: str) -> None:
    """Delete ``prefix`` files whose creating process no longer exists (killed before it could)."""
    pattern = re.compile(rf"{re.escape(prefix)}-(\d+)-[0-9a-f]{{12}}")
    for path in folder.glob(f"{prefix}-*"):
        match = pattern.fullmatch(path.name)
        if match is None:
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        except (PermissionError, OverflowError):  # alive (another user's), or not a pid
            continue


def _remove(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
