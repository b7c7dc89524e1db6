"""What to pack: a local directory tree walked into samples, with every problem reported.

The walk reads one directory listing at a time, sorted by name. In each directory it yields
the samples of its files (grouped by key, sorted by key, members sorted by name), then
descends into its subdirectories in name order, so the order depends only on the tree.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .errors import SourceError, SourceNotFoundError
from .format import split_key

__all__ = ["Problem", "ProblemKind", "Sample", "SourceFile", "walk_samples"]


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A file to pack: its member name (path relative to the source, ``/``-separated)."""

    member_name: str
    path: str
    size: int


@dataclass(frozen=True, slots=True)
class Sample:
    """Files sharing a key, members sorted by name."""

    key: str
    files: tuple[SourceFile, ...]


class ProblemKind(enum.Enum):
    """Why an entry under the source was not packed."""

    UNREADABLE = "unreadable"  # cannot be opened, read or listed; a broken symlink
    NOT_REGULAR = "not_regular"  # FIFO, socket, device, or a symlink to a directory


@dataclass(frozen=True, slots=True)
class Problem:
    """One entry under the source that was not packed, and why."""

    path: str
    kind: ProblemKind
    reason: str


def check_source(root: str | os.PathLike[str]) -> str:
    """The source directory as an absolute path.

    Raises:
        SourceNotFoundError: it does not exist.
        SourceError: it is not a directory.
    """
    path = os.path.abspath(os.fspath(root))
    if not os.path.exists(path):
        raise SourceNotFoundError(f"{path}: no such directory (check SOURCE)")
    if not os.path.isdir(path):
        raise SourceError(f"{path}: not a directory; SOURCE must be a directory of files")
    return path


def walk_samples(root: str, *, on_problem: Callable[[Problem], None]) -> Iterator[Sample]:
    """Yield the samples under ``root`` in a deterministic order (module doc).

    Args:
        root: an absolute directory path (see :func:`check_source`).
        on_problem: called for each entry that is not packed (unlistable directory, broken
            symlink, FIFO, socket, device, symlink to a directory).
    """
    yield from _walk_dir(root, "", on_problem)


def _walk_dir(path: str, rel: str, on_problem: Callable[[Problem], None]) -> Iterator[Sample]:
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        on_problem(Problem(path, ProblemKind.UNREADABLE, f"cannot list directory: {exc.strerror or exc}"))
        return
    by_key: dict[str, list[SourceFile]] = {}
    subdirs: list[os.DirEntry[str]] = []
    for entry in entries:
        member_name = rel + entry.name
        try:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry)
                continue
            if entry.is_file():
                size = entry.stat().st_size
            elif entry.is_symlink():
                kind, reason = (
                    (ProblemKind.NOT_REGULAR, "symlink to a directory (not followed)")
                    if entry.is_dir()
                    else (ProblemKind.UNREADABLE, "broken symlink")
                )
                on_problem(Problem(entry.path, kind, reason))
                continue
            else:
                on_problem(Problem(entry.path, ProblemKind.NOT_REGULAR, "not a regular file (FIFO, socket or device)"))
                continue
        except OSError as exc:
            on_problem(Problem(entry.path, ProblemKind.UNREADABLE, exc.strerror or str(exc)))
            continue
        key, _ = split_key(member_name)
        by_key.setdefault(key, []).append(SourceFile(member_name, entry.path, size))
    for key in sorted(by_key):
        yield Sample(key, tuple(by_key[key]))
    del by_key, entries
    for entry in subdirs:
        yield from _walk_dir(entry.path, f"{rel}{entry.name}/", on_problem)
