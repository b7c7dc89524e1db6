"""What to pack: a local directory, a file list, or an S3 prefix, turned into samples.

Each source yields :class:`Sample` values in a deterministic order and reports every entry it
will not pack (or packs with a warning) to an ``on_problem`` callback; nothing is dropped
silently.

- A local directory is walked one directory listing at a time, sorted by name: the samples
  of its files first (grouped by key, sorted by key), then its subdirectories in name order.
- An S3 prefix is listed the same way, one "directory" (``Delimiter="/"``) page by page.
- A file list (newline- or NUL-separated paths relative to the source directory) is taken
  in its own order; consecutive entries with the same key form one sample, so a sample's
  files must be adjacent in the list (``sort`` it).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import SourceError, SourceNotFoundError
from ..format import RESERVED_FIELDS, split_key

__all__ = [
    "Problem",
    "ProblemKind",
    "Sample",
    "SourceFile",
    "check_source",
    "iter_list_samples",
    "iter_s3_samples",
    "walk_samples",
]


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A file to pack: its member name (relative, ``/``-separated), where to read it (a
    local path, or an ``s3://`` URL), and its size in bytes when the listing gave it (None
    for the local walk, which does not stat files that another stream will read)."""

    member_name: str
    path: str
    size: int | None


@dataclass(frozen=True, slots=True)
class Sample:
    """Files sharing a key, members sorted by name."""

    key: str
    files: tuple[SourceFile, ...]


class ProblemKind(enum.Enum):
    """Why an entry of the source was not packed (``EMPTY`` files are packed, and reported)."""

    UNREADABLE = "unreadable"  # cannot be opened, read or listed; a broken symlink
    NOT_REGULAR = "not_regular"  # FIFO, socket, device, or a symlink to a directory
    VANISHED = "vanished"  # listed, then gone when read
    CHANGED = "changed"  # its size changed while it was packed
    BAD_NAME = "bad_name"  # not UTF-8, a line break, a reserved extension, outside SOURCE
    COLLISION = "collision"  # maps to the same member as another file (e.g. a.JPG / a.jpg)
    EMPTY = "empty"  # zero bytes: packed, but reported as it is usually a broken file
    FN_ERROR = "fn_error"  # pack_samples: fn raised on the input (path holds the input's repr)


@dataclass(frozen=True, slots=True)
class Problem:
    """One entry of the source that was not packed (or packed with a warning), and why."""

    path: str
    kind: ProblemKind
    reason: str

    @property
    def packed(self) -> bool:
        return self.kind is ProblemKind.EMPTY

    def to_json(self) -> dict[str, str | bool]:
        return {"path": self.path, "kind": self.kind.value, "reason": self.reason, "packed": self.packed}

    @classmethod
    def from_json(cls, doc: dict[str, str]) -> Problem:
        return cls(doc["path"], ProblemKind(doc["kind"]), doc["reason"])


OnProblem = Callable[[Problem], None]


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


def name_problem(member_name: str, path: str) -> Problem | None:
    """Why ``member_name`` cannot be a member, or None when it can."""
    _, ext = split_key(member_name)
    if ext in RESERVED_FIELDS:
        return Problem(path, ProblemKind.BAD_NAME, f"extension {ext!r} is a reserved sample field; rename the file")
    if "\n" in member_name or "\r" in member_name:
        return Problem(path, ProblemKind.BAD_NAME, "file name contains a line break; rename the file")
    try:
        member_name.encode("utf-8")
    except UnicodeEncodeError:
        return Problem(path, ProblemKind.BAD_NAME, "file name is not valid UTF-8; rename the file")
    return None


def _samples(files: Iterable[SourceFile], on_problem: OnProblem) -> list[Sample]:
    """Group files by key into samples sorted by key; report bad names and collisions.

    Two files collide when they give the same extension of one sample, compared
    case-insensitively (``a`` / ``a.``; ``a.JPG`` / ``a.jpg`` on a case-folding file system).
    """
    by_key: dict[str, dict[str, SourceFile]] = {}
    for file in files:
        problem = name_problem(file.member_name, file.path)
        if problem is not None:
            on_problem(problem)
            continue
        key, ext = split_key(file.member_name)
        members = by_key.setdefault(key, {})
        other = members.get(ext.lower())
        if other is not None:
            on_problem(
                Problem(
                    file.path,
                    ProblemKind.COLLISION,
                    f"same member as {other.path!r} ({key!r}, extension {ext!r}); rename one",
                )
            )
            continue
        members[ext.lower()] = file
    return [Sample(key, tuple(sorted(by_key[key].values(), key=lambda f: f.member_name))) for key in sorted(by_key)]


def walk_samples(root: str, *, on_problem: OnProblem) -> Iterator[Sample]:
    """Yield the samples under the local directory ``root`` (module doc).

    Args:
        root: an absolute directory path (see :func:`check_source`).
        on_problem: called for each entry not packed, or packed with a warning.
    """
    yield from _walk_dir(root, "", on_problem)


def _walk_dir(path: str, rel: str, on_problem: OnProblem) -> Iterator[Sample]:
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        on_problem(Problem(path, ProblemKind.UNREADABLE, f"cannot list directory: {exc.strerror or exc}"))
        return
    files: list[SourceFile] = []
    subdirs: list[str] = []
    for entry in entries:
        problem = None
        try:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            elif entry.is_file():
                files.append(SourceFile(rel + entry.name, entry.path, None))
            elif entry.is_symlink():
                problem = (
                    Problem(entry.path, ProblemKind.NOT_REGULAR, "symlink to a directory (not followed)")
                    if entry.is_dir()
                    else Problem(entry.path, ProblemKind.UNREADABLE, "broken symlink")
                )
            else:
                problem = Problem(entry.path, ProblemKind.NOT_REGULAR, "not a regular file (FIFO, socket or device)")
        except FileNotFoundError:
            problem = Problem(entry.path, ProblemKind.VANISHED, "vanished while listed")
        except OSError as exc:
            problem = Problem(entry.path, ProblemKind.UNREADABLE, exc.strerror or str(exc))
        if problem is not None:
            on_problem(problem)  # outside the try: it may raise an OSError subclass itself
    del entries
    yield from _samples(files, on_problem)
    del files
    for name in subdirs:
        yield from _walk_dir(os.path.join(path, name), f"{rel}{name}/", on_problem)


def split_entries(stream: BinaryIO, chunk_bytes: int = 1 << 16) -> Iterator[bytes]:
    """Entries of a list file: NUL-separated if it holds a NUL byte, else one per line."""
    separator: bytes | None = None
    pending = b""
    while chunk := stream.read(chunk_bytes):
        pending += chunk
        if separator is None:
            separator = b"\0" if b"\0" in pending else None
        parts = pending.split(separator or b"\n")
        pending = parts.pop()
        yield from (p.rstrip(b"\r") if separator is None else p for p in parts if p)
    if pending.strip(b"\r"):
        yield pending.rstrip(b"\r") if separator is None else pending


def iter_list_samples(root: str, list_path: str, *, on_problem: OnProblem) -> Iterator[Sample]:
    """Yield samples of the files named in ``list_path``, paths relative to ``root``.

    Raises:
        SourceNotFoundError: the list file does not exist.
    """
    try:
        stream = open(list_path, "rb")  # noqa: SIM115 - entered below, once it opened
    except FileNotFoundError:
        raise SourceNotFoundError(f"{list_path}: no such file list (check --files-from)") from None
    with stream:
        group: list[SourceFile] = []
        group_key: str | None = None
        for raw in split_entries(stream):
            rel = os.fsdecode(raw)
            norm = os.path.normpath(rel).replace(os.sep, "/")
            path = os.path.join(root, norm)
            if os.path.isabs(rel) or norm == ".." or norm.startswith("../"):
                on_problem(Problem(rel, ProblemKind.BAD_NAME, "not a path inside SOURCE"))
                continue
            key = split_key(norm)[0]
            if key != group_key and group:
                yield from _samples(group, on_problem)
                group = []
            group_key = key
            try:
                info = os.stat(path)
            except FileNotFoundError:
                on_problem(Problem(path, ProblemKind.VANISHED, "listed in --files-from but does not exist"))
                continue
            except OSError as exc:
                on_problem(Problem(path, ProblemKind.UNREADABLE, exc.strerror or str(exc)))
                continue
            if not os.path.isfile(path):
                on_problem(Problem(path, ProblemKind.NOT_REGULAR, "not a regular file"))
                continue
            group.append(SourceFile(norm, path, info.st_size))
        yield from _samples(group, on_problem)


def iter_s3_samples(store: object, *, on_problem: OnProblem) -> Iterator[Sample]:
    """Yield the samples under an S3 prefix (an :class:`~shardstream.storage.s3.S3Store`),
    one "directory" listing at a time. ``SourceFile.path`` is the object's ``s3://`` URL.
    """
    yield from _s3_dir(store, "", on_problem)


def _s3_dir(store, rel: str, on_problem: OnProblem) -> Iterator[Sample]:
    files: list[SourceFile] = []
    subdirs: list[str] = []
    for name, size, is_dir in store.list_dir(rel):
        if is_dir:
            subdirs.append(name)
        elif not name.endswith("/"):  # "folder" marker objects hold no file
            files.append(SourceFile(name, store.url_of(name), size))
    yield from _samples(files, on_problem)
    for name in sorted(subdirs, key=lambda n: n.rstrip("/")):  # the local walk's order
        yield from _s3_dir(store, name, on_problem)
