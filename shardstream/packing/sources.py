"""What to pack: a local directory, a file list, or an S3 prefix, turned into samples.

Each source yields :class:`Sample` values in a deterministic order and reports every entry it
will not pack (or packs with a warning) to an ``on_problem`` callback; nothing is dropped
silently.

- A local directory is walked depth first, each directory's entries sorted by name: the
  samples of its files first (grouped by key, sorted by key), then its subdirectories in name
  order. Up to 64 directories ahead of the one consumed are scanned, on one thread while
  scans are CPU-bound (a page-cached tree), on 4 once they wait (network file systems, a
  cold disk).
- An object-store prefix (``s3://``, ``gs://``, ``az://``) is walked the same way, one
  "directory" (``Delimiter="/"``) at a time, directories listed concurrently.
- A file list (newline- or NUL-separated paths relative to the source directory) is taken
  in its own order; consecutive entries with the same key form one sample, so a sample's
  files must be adjacent in the list (``sort`` it).
"""

from __future__ import annotations

import concurrent.futures
import enum
import operator
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..errors import SourceError, SourceNotFoundError
from ..format import RESERVED_FIELDS, split_key
from ..storage import is_remote_url, open_store

__all__ = [
    "Problem",
    "ProblemKind",
    "Sample",
    "SourceFile",
    "check_source",
    "group_samples",
    "iter_list_samples",
    "iter_source_samples",
    "lister_of",
    "merged_problem",
    "ordered_walk",
    "walk_samples",
]

LIST_THREADS = 16  # store "directories" listed at once (each LIST a round trip)
LOCAL_LIST_THREADS = 4  # local directories scanned at once where scans wait (ordered_walk)
LIST_WINDOW = 64  # directories listed ahead of the one consumed


# SourceFile and Sample are not frozen: a listing makes one of each per file and per sample
# (10^10 at most), and a frozen dataclass's __init__ costs four times a plain one's.
@dataclass(slots=True)
class SourceFile:
    """A member to pack: its member name (relative, ``/``-separated), where to read it (a
    local path, or an ``s3://`` URL), and its size in bytes when the listing gave it (None
    for the local walk, which does not stat files that another stream will read).

    ``rel`` is the file's path relative to SOURCE where it differs from ``member_name``
    (``--labels-from-dirs`` renames members); ``data`` holds the bytes of a member pack makes
    itself (the ``cls`` and ``json`` members of a labelled sample), which has no file (``path``
    is then empty).
    """

    member_name: str
    path: str
    size: int | None
    rel: str | None = None
    data: bytes | None = None


@dataclass(slots=True)
class Sample:
    """Files sharing a key, members sorted by name."""

    key: str
    files: tuple[SourceFile, ...]


class ProblemKind(enum.Enum):
    """Why an entry of the source was not packed, or was packed with a warning (``EMPTY``,
    ``MERGED`` and ``NO_METADATA``: :attr:`Problem.packed`)."""

    UNREADABLE = "unreadable"  # cannot be opened, read or listed; a broken symlink
    NOT_REGULAR = "not_regular"  # FIFO, socket, device, or a symlink to a directory
    VANISHED = "vanished"  # listed, then gone when read
    CHANGED = "changed"  # its size changed while it was packed
    # its size changed between the listing and its reading (a bad file fixed before a resume):
    # packed as it is now, so its shard ends a little past or short of the plan
    RESIZED = "resized"
    BAD_NAME = "bad_name"  # not UTF-8, a line break, a reserved extension, outside SOURCE
    COLLISION = "collision"  # maps to the same member as another file (e.g. a.JPG / a.jpg)
    EMPTY = "empty"  # zero bytes: packed, but reported as it is usually a broken file
    FN_ERROR = "fn_error"  # pack_samples: fn raised on the input (path holds the input's repr)
    # one key gathers files that differ only by an extra dot part (a.JPEG, a.b.JPEG): packed as one sample
    MERGED = "merged"
    UNDECODABLE = "undecodable"  # --check-images: an image member does not decode; its sample is left out
    UNLABELLED = "unlabelled"  # --labels-from-dirs: a file directly under SOURCE, in no class folder
    METADATA = "metadata"  # --labels-from-dirs: a metadata.jsonl / metadata.csv or one of its rows cannot be used
    # --labels-from-dirs: a file a metadata file covers has no row there (packed without a json member)
    NO_METADATA = "no_metadata"
    # --labels-from-dirs: a hidden file (.DS_Store, macOS's ._x, .gitkeep): not packed, reported, and
    # no reason to stop a pack under on_error="raise" (._x.jpg is macOS's metadata, not an image)
    HIDDEN = "hidden"
    # a labelled pack with a pinned class list (--classes, --classes-from): a label or class
    # folder not in it; the file is left out
    UNKNOWN_CLASS = "unknown_class"
    # plain pack: a file without a suffix (README): packed as a member without an extension
    NO_SUFFIX = "no_suffix"
    # plain pack: a Hugging Face metadata.csv / metadata.jsonl, which is no sample: left out,
    # reported, never a reason to stop (--labels-from-dirs uses it)
    NOT_A_SAMPLE = "not_a_sample"


_PACKED_KINDS = frozenset(
    {ProblemKind.EMPTY, ProblemKind.MERGED, ProblemKind.NO_METADATA, ProblemKind.RESIZED, ProblemKind.NO_SUFFIX}
)
# left out and reported, but never a reason to stop a pack under on_error="raise"
NEVER_STOPS = frozenset({ProblemKind.HIDDEN, ProblemKind.NOT_A_SAMPLE})
METADATA_NAMES = ("metadata.jsonl", "metadata.csv")  # Hugging Face imagefolder's (packing.metadata)


@dataclass(frozen=True, slots=True)
class Problem:
    """One entry of the source that was not packed (or packed with a warning), and why.

    Attributes:
        path: the file (local path or URL), or what else the problem is about.
        kind: why (:class:`ProblemKind`).
        reason: a phrase naming what to do.
        count: how many problems this entry stands for: 1, or more for the one entry that
            counts the warnings of a kind beyond those listed one by one.
        cls: the class index of the labelled sample this problem left out (so the index's
            per-class counts are those of the samples packed), else None.
    """

    path: str
    kind: ProblemKind
    reason: str
    count: int = 1
    cls: int | None = None

    @property
    def packed(self) -> bool:
        return self.kind in _PACKED_KINDS

    def to_json(self) -> dict[str, str | bool | int]:
        doc: dict[str, str | bool | int] = {
            "path": self.path,
            "kind": self.kind.value,
            "reason": self.reason,
            "packed": self.packed,
        }
        if self.count != 1:
            doc["count"] = self.count
        if self.cls is not None:
            doc["cls"] = self.cls
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Problem:
        return cls(
            doc["path"],
            ProblemKind(doc["kind"]),
            doc["reason"],
            count=int(doc.get("count", 1)),
            cls=None if doc.get("cls") is None else int(doc["cls"]),
        )


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


def group_samples(files: Iterable[SourceFile], on_problem: OnProblem) -> list[Sample]:
    """Group files by key into samples sorted by key; report bad names, collisions and merges.

    Two files collide when they give the same extension of one sample, compared
    case-insensitively (``a`` / ``a.``; ``a.JPG`` / ``a.jpg`` on a case-folding file system):
    the second is not packed. Files of one key whose extensions end in the same last dot
    part (``a.JPEG`` / ``a.b.JPEG``: extensions ``JPEG`` and ``b.JPEG``) are packed as one
    sample, as WebDataset groups them, and reported (``MERGED``, once per key).
    """
    by_key: dict[str, dict[str, SourceFile]] = {}
    for file in files:
        name = file.member_name
        key, ext = split_key(name)
        if ext in RESERVED_FIELDS or "\n" in name or "\r" in name or not name.isascii():
            problem = name_problem(name, file.path)  # the usual name passes these checks at once
            if problem is not None:
                on_problem(problem)
                continue
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
        if not ext:
            on_problem(
                Problem(
                    file.path,
                    ProblemKind.NO_SUFFIX,
                    "has no suffix (such as .jpg): packed as a member without an extension (sample['']); rename it, "
                    "or leave it out of SOURCE",
                )
            )
    samples = []
    for key in sorted(by_key):
        members = by_key[key]
        if len(members) == 1:
            samples.append(Sample(key, tuple(members.values())))
            continue
        sample = Sample(key, tuple(sorted(members.values(), key=_member_name)))
        # only where two extensions (lower-cased) share their last dot part can it warn, and
        # distinct extensions without a dot cannot
        if "." in "".join(members) and len({ext.rpartition(".")[2] for ext in members}) < len(members):
            merged = merged_problem(sample)
            if merged is not None:
                on_problem(merged)
        samples.append(sample)
    return samples


_member_name = operator.attrgetter("member_name")


def merged_problem(sample: Sample) -> Problem | None:
    """The ``MERGED`` warning of a sample whose members' extensions share their last dot
    part, compared case-insensitively (``a.JPEG`` with ``a.b.JPEG``), else None."""
    by_last: dict[str, list[SourceFile]] = {}
    for file in sample.files:
        ext = split_key(file.member_name)[1]
        by_last.setdefault(ext.rsplit(".", 1)[-1].lower(), []).append(file)
    merged = [files for files in by_last.values() if len(files) > 1]
    if not merged:
        return None
    files = merged[0]
    names = _and([repr(f.member_name.rsplit("/", 1)[-1]) for f in files])
    exts = _and([repr(split_key(f.member_name)[1]) for f in files])
    return Problem(
        files[0].path,
        ProblemKind.MERGED,
        f"key {sample.key!r} gathers {len(files)} files that differ only by an extra dot part, {names}: packed "
        f"as one sample with members {exts} (the WebDataset rule); if they are different files, rename one "
        "(a tree of class folders: pack it with --labels-from-dirs)",
    )


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


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
                yield from group_samples(group, on_problem)
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
        yield from group_samples(group, on_problem)


ListDir = Callable[[str], tuple[list[SourceFile], list[str], list[Problem]]]


def ordered_walk(
    list_dir: ListDir, *, threads: int = LIST_THREADS, window: int = LIST_WINDOW
) -> Iterator[tuple[str, list[SourceFile], list[str], list[Problem]]]:
    """``(rel, files, subdirs, problems)`` of each directory in walk order (a directory's
    files, then its subdirectories in order, depth first; ``rel`` is ``""`` for the root, else
    ``"a/b/"``).

    Up to ``window`` directories ahead of the one consumed are listed, on one thread while
    listing is CPU-bound (a page-cached local tree: more threads would only take turns at the
    GIL, each ``stat`` handing it over; a third slower, measured), on ``threads`` threads once
    it waits (seconds off the CPU by the scans' own waits, not queued for a CPU, past twice
    their CPU time and 50 ms: an object store, a network file system, a cold disk). A loaded
    machine's preemptions are no reason to widen: queued time is left out, and 50 ms is more
    than a few stalls at the GIL while its holder is preempted (3-6 ms in all in a loaded CI's
    walk of 85 folders; at 10 ms such a walk widened)."""
    futures: dict[str, concurrent.futures.Future] = {}
    pending = [""]  # directories not consumed yet; the next one is last
    waited_s = cpu_s = 0.0
    clocks = _ThreadClocks()
    one = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shardstream-list")
    many = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shardstream-list")
    pool = one
    try:
        with one, many:
            try:
                while pending:
                    for rel in reversed(pending[-window:]):
                        if rel not in futures:
                            futures[rel] = pool.submit(_timed, list_dir, rel, clocks)
                    rel = pending.pop()
                    (files, subdirs, problems), waited, cpu = futures.pop(rel).result()
                    waited_s, cpu_s = waited_s + waited, cpu_s + cpu
                    if waited_s > max(0.05, 2 * cpu_s):
                        pool = many
                    pending.extend(reversed(subdirs))
                    yield rel, files, subdirs, problems
            finally:
                for future in futures.values():
                    future.cancel()
    finally:
        clocks.close()  # after the pools' threads have ended


class _ThreadClocks:
    """The calling thread's kernel clocks: ``(cpu_s, queued_s)``, ``cpu_s`` its CPU seconds
    (``time.thread_time``), ``queued_s`` the seconds it sat runnable in the kernel's queue for a
    CPU (the run delay of Linux's ``/proc/thread-self/schedstat``, one descriptor kept per
    thread, ~3 us a read; elsewhere 0). The run time in that file is not used: for the thread
    reading it, it lags by up to a scheduler tick (ms, measured). Wall less CPU less queued is
    the time the thread waited by itself: I/O, a sleep, a lock."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}

    def read(self) -> tuple[float, float]:
        thread = threading.get_ident()
        fd = self._fds.get(thread)
        if fd is None:
            try:
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:  # not Linux, or no /proc
                fd = -1
            self._fds[thread] = fd
        if fd < 0:
            return time.thread_time(), 0.0
        queued_ns = os.pread(fd, 64, 0).split()[1]
        return time.thread_time(), int(queued_ns) / 1e9

    def close(self) -> None:
        for fd in self._fds.values():
            if fd >= 0:
                os.close(fd)
        self._fds.clear()


def _timed(
    list_dir: ListDir, rel: str, clocks: _ThreadClocks
) -> tuple[tuple[list[SourceFile], list[str], list[Problem]], float, float]:
    """``list_dir(rel)``, the seconds its thread waited by itself (off the CPU and not queued
    for one) and its CPU seconds. The start reads the kernel's clocks before the wall clock and
    the end after it, so a preemption between two reads can only shorten the wait."""
    cpu, queued = clocks.read()
    wall = time.perf_counter()
    result = list_dir(rel)
    wall2 = time.perf_counter()
    cpu2, queued2 = clocks.read()
    return result, (wall2 - wall) - (cpu2 - cpu) - (queued2 - queued), cpu2 - cpu


_entry_name = operator.attrgetter("name")


def _local_lister(root: str) -> ListDir:
    def list_dir(rel: str) -> tuple[list[SourceFile], list[str], list[Problem]]:
        path = os.path.join(root, rel) if rel else root
        problems: list[Problem] = []
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=_entry_name)
        except OSError as exc:
            return [], [], [Problem(path, ProblemKind.UNREADABLE, f"cannot list directory: {exc.strerror or exc}")]
        files: list[SourceFile] = []
        subdirs: list[str] = []
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):  # the usual entry: no symlink to follow
                    files.append(SourceFile(rel + entry.name, entry.path, entry.stat(follow_symlinks=False).st_size))
                elif entry.is_dir(follow_symlinks=False):
                    subdirs.append(f"{rel}{entry.name}/")
                elif entry.is_file():
                    files.append(SourceFile(rel + entry.name, entry.path, entry.stat().st_size))
                elif entry.is_symlink():
                    problems.append(
                        Problem(entry.path, ProblemKind.NOT_REGULAR, "symlink to a directory (not followed)")
                        if entry.is_dir()
                        else Problem(entry.path, ProblemKind.UNREADABLE, "broken symlink")
                    )
                else:
                    problems.append(
                        Problem(entry.path, ProblemKind.NOT_REGULAR, "not a regular file (FIFO, socket or device)")
                    )
            except FileNotFoundError:
                problems.append(Problem(entry.path, ProblemKind.VANISHED, "vanished while listed"))
            except OSError as exc:
                problems.append(Problem(entry.path, ProblemKind.UNREADABLE, exc.strerror or str(exc)))
        return files, subdirs, problems

    return list_dir


def _remote_lister(store) -> ListDir:
    def list_dir(rel: str) -> tuple[list[SourceFile], list[str], list[Problem]]:
        files: list[SourceFile] = []
        subdirs: list[str] = []
        for name, size, is_dir in store.list_dir(rel):
            if is_dir:
                subdirs.append(name)
            elif not name.endswith("/"):  # "folder" marker objects hold no file
                files.append(SourceFile(name, store.url_of(name), size))
        subdirs.sort(key=lambda n: n.rstrip("/"))  # the local walk's order
        return files, subdirs, []

    return list_dir


def iter_source_samples(
    source: str,
    *,
    list_path: str | None,
    on_problem: OnProblem,
    s3=None,
    requests=None,
    threads: int | None = None,
) -> Iterator[Sample]:
    """The samples of a pack's source in walk order, every file with its size.

    Args:
        source: an absolute local directory, or a store URL (``s3://``, ``gs://``, ``az://``).
        list_path: a ``--files-from`` list (paths relative to ``source``), or None to walk it.
        on_problem: called, in walk order, for each entry not packed or packed with a warning.
        s3: the S3 endpoint and credentials for an ``s3://`` source.
        requests: the store's request policy (:class:`~shardstream.config.RequestConfig`).
        threads: directories listed at once (default: 16 for a store, 4 for a local tree).
    """
    if list_path is not None:
        yield from iter_list_samples(source, list_path, on_problem=on_problem)
        return
    lister, threads = lister_of(source, s3=s3, requests=requests, threads=threads)
    for _, files, _, problems in ordered_walk(lister, threads=threads):
        for problem in problems:
            on_problem(problem)
        yield from group_samples(_not_samples_left_out(files, on_problem), on_problem)


def _not_samples_left_out(files: list[SourceFile], on_problem: OnProblem) -> list[SourceFile]:
    """A walked folder's files less those that are no sample, each reported (never a reason to
    stop): hidden files (``.DS_Store``, macOS's ``._x.jpg``) and Hugging Face metadata files."""
    names = "\0" + "\0".join(map(_member_name, files)) + "\0"
    if "\0." not in names and "/." not in names and not any(f"{m}\0" in names for m in METADATA_NAMES):
        return files  # the usual folder holds neither: one look at all its names
    kept = []
    for file in files:
        name = file.member_name.rsplit("/", 1)[-1]
        if name.startswith("."):
            on_problem(Problem(file.path, ProblemKind.HIDDEN, "a hidden file (such as .DS_Store): not packed"))
        elif name in METADATA_NAMES:
            on_problem(
                Problem(
                    file.path,
                    ProblemKind.NOT_A_SAMPLE,
                    "a Hugging Face metadata file, not a sample: not packed (pack --labels-from-dirs adds its rows "
                    "to the samples as json members; --labels-from FILE takes labels from such a file)",
                )
            )
        else:
            kept.append(file)
    return kept


def lister_of(source: str, *, s3=None, requests=None, threads: int | None = None) -> tuple[ListDir, int]:
    """The directory lister of a local directory or a store URL, and the directories it lists
    at once (``threads``, default: 16 for a store, 4 for a local tree)."""
    remote = is_remote_url(source)
    lister = _remote_lister(open_store(source, s3=s3, requests=requests)) if remote else _local_lister(source)
    return lister, threads or (LIST_THREADS if remote else LOCAL_LIST_THREADS)


def walk_samples(root: str, *, on_problem: OnProblem, threads: int | None = None) -> Iterator[Sample]:
    """The samples under the local directory ``root`` (an absolute path, see
    :func:`check_source`) in walk order, each file with its size."""
    return iter_source_samples(root, list_path=None, on_problem=on_problem, threads=threads)
