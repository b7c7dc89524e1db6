"""List a pack's source once, plan its shards, and hand each stream its own range.

A pack of files (a directory tree, ``--files-from``, an ``s3://``, ``gs://`` or ``az://``
prefix) is listed **once** per pack, whatever the number of parts and workers:

1. The source is walked in its deterministic order (:mod:`shardstream.packing.sources`), many
   directories at a time: subdirectories of a local tree are scanned on a thread pool, and an
   object store's "directories" (``Delimiter="/"`` common prefixes) are listed concurrently, while
   the results are consumed in walk order. Each file's size comes with the listing (a ``stat``
   for local files, the LIST answer for objects).
2. With ``shuffle``, samples pass a seeded shuffle buffer.
3. The samples are cut into shards by the writer's own rule (``ShardLimits`` of
   :mod:`shardstream.packing.writer`: a shard ends before the sample that would push it past
   ``max_shard_bytes``, headers, padding and end-of-archive included, or past
   ``max_samples_per_shard``), so the shard of every sample is known before any is read.
4. The plan is written as listing files ``DEST/.shardstream/list-NNNNNN.txt``, each holding
   whole shards (a new file starts at the first shard boundary after :data:`LIST_FILE_ENTRIES`
   files), then ``list-problems.jsonl`` (what the walk did not pack) and ``list-done.json``
   (the files' shard ranges and totals; written last).

Shard ``g`` is named ``NAME-{g:06d}.tar``; stream ``s`` of ``S`` writes shards
``[s*N//S, (s+1)*N//S)`` and reads only the listing files holding them. The shards' bytes
depend on the source and the options, never on how many machines, workers or which launcher
wrote them.

One process lists: the first to create ``list-lock.json``. It rewrites the lock every
:data:`HEARTBEAT_S` seconds; the others wait for ``list-done.json`` and take the listing over when
the lock has not moved for :data:`STALE_LOCK_S` seconds (its lister died). Two listers write the
same bytes, so a race costs time, never correctness.

A listing file's lines are samples: ``member\\0size\\0member\\0size...``, preceded by one JSON
line ``{"first_shard": g, "shard_samples": [n, ...]}``. A member named otherwise than its file
(``--labels-from-dirs``) is ``member\\0size:path`` (the file's path relative to SOURCE); a member
pack makes itself (a labelled sample's ``cls`` and ``json``) is ``member\\0=bytes`` (bytes without
NUL or line break). A labelled pack also records its classes (:func:`.labels.write_classes`)
before ``list-done.json``.

Problems of the kinds that may come with every sample (``MERGED``, ``NO_METADATA``, and
``HIDDEN``: macOS may write a ``._x`` beside every file) are listed one by one up to
:data:`WARNINGS_LISTED` of each kind; one more entry counts the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import DestinationError, IndexFormatError, SourceNotFoundError
from ..format import BLOCK_BYTES, member_header_size, split_key
from ..shuffle import shuffle_buffer
from ..storage import Store, is_remote_url, open_store, split_url
from .label_file import parse_label_file
from .labels import ClassCounts, walk_labelled, write_classes
from .sources import OnProblem, Problem, ProblemKind, Sample, SourceFile, iter_source_samples
from .writer import ShardLimits

__all__ = ["LIST_PREFIX", "Listing", "ensure_listing", "plan_shards", "write_listing"]

LIST_PREFIX = ".shardstream/list-"  # beside the journal's records: one folder for all pack state
LISTING_DONE = f"{LIST_PREFIX}done.json"  # the name shardstream.index.status reads too
LISTING_LOCK = f"{LIST_PREFIX}lock.json"
LISTING_PROBLEMS = f"{LIST_PREFIX}problems.jsonl"
LIST_FILE_ENTRIES = 1 << 16  # files per listing file (rounded up to a shard boundary)
HEARTBEAT_S = 15.0
STALE_LOCK_S = 120.0
WAIT_POLL_S = 0.5
WARNINGS_LISTED = 1000  # per kind of warning that may come with every sample (module doc)
_CAPPED_KINDS = (ProblemKind.MERGED, ProblemKind.NO_METADATA, ProblemKind.HIDDEN, ProblemKind.NO_SUFFIX)


@dataclass(frozen=True)
class Listing:
    """A finished listing (``list-done.json``): totals, and per listing file ``(first_shard,
    num_shards, num_files)``. Sizes are bytes."""

    spec_digest: str
    num_files: int
    num_samples: int
    num_shards: int
    payload_bytes: int
    files: tuple[tuple[int, int, int], ...]
    files_from_sha1: str | None = None  # of the --files-from list that was listed
    labels_sha1: str | None = None  # of the --labels-from file that was listed

    def shard_range(self, stream: int, num_streams: int) -> tuple[int, int]:
        """The shards ``[first, end)`` stream ``stream`` of ``num_streams`` writes."""
        return stream * self.num_shards // num_streams, (stream + 1) * self.num_shards // num_streams

    def files_in(self, first: int, end: int) -> int:
        """About how many source files the shards ``[first, end)`` hold (for a progress bar)."""
        total = 0
        for start, count, files in self.files:
            overlap = min(end, start + count) - max(first, start)
            if overlap > 0:
                total += files * overlap // count
        return total

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "spec": self.spec_digest,
                "num_files": self.num_files,
                "num_samples": self.num_samples,
                "num_shards": self.num_shards,
                "payload_bytes": self.payload_bytes,
                "files": [list(f) for f in self.files],
                "files_from_sha1": self.files_from_sha1,
                **({"labels_sha1": self.labels_sha1} if self.labels_sha1 else {}),
            }
        ).encode()

    @classmethod
    def load(cls, store: Store, spec_digest: str) -> Listing:
        """Read ``list-done.json``.

        Raises:
            IndexFormatError: it is damaged or belongs to a pack with other options.
        """
        url = store.url_of(LISTING_DONE)
        try:
            doc = json.loads(store.read_bytes(LISTING_DONE))
            listing = cls(
                spec_digest=doc["spec"],
                num_files=int(doc["num_files"]),
                num_samples=int(doc["num_samples"]),
                num_shards=int(doc["num_shards"]),
                payload_bytes=int(doc["payload_bytes"]),
                files=tuple((int(a), int(n), int(f)) for a, n, f in doc["files"]),
                files_from_sha1=doc.get("files_from_sha1"),
                labels_sha1=doc.get("labels_sha1"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexFormatError(f"{url}: damaged pack listing ({exc!r}); pack again with --overwrite") from exc
        if listing.spec_digest != spec_digest:
            raise IndexFormatError(f"{url}: listed for a pack with other options; pack again with --overwrite")
        return listing

    def iter_shards(self, store: Store, source_url: str, first: int, end: int) -> Iterator[tuple[int, Sample]]:
        """``(shard, sample)`` for the samples of shards ``[first, end)``, in order, reading
        only the listing files that hold them. A source file's path is its local path or URL."""
        remote = is_remote_url(source_url)
        base = source_url if not remote and source_url.endswith("/") else source_url + "/"  # as os.path.join
        for number, (start, count, _) in enumerate(self.files):
            if start + count <= first or start >= end:
                continue
            name = list_file_name(number)
            data = store.read_bytes(name)
            header, _, body = data.partition(b"\n")
            try:
                doc = json.loads(header)
                shard_samples = [int(n) for n in doc["shard_samples"]]
                if int(doc["first_shard"]) != start or len(shard_samples) != count:
                    raise ValueError("its header does not match list-done.json")
            except (ValueError, KeyError, TypeError) as exc:
                raise IndexFormatError(
                    f"{store.url_of(name)}: damaged pack listing ({exc!r}); pack again with --overwrite"
                ) from exc
            lines = iter(body.split(b"\n"))
            for shard, num_samples in enumerate(shard_samples, start):
                for _ in range(num_samples):
                    line = next(lines)
                    if shard < first or shard >= end:
                        continue
                    fields = line.split(b"\0")
                    files = []
                    for i in range(0, len(fields), 2):
                        member, entry = fields[i].decode(), fields[i + 1]
                        if entry[:1] == b"=":
                            files.append(SourceFile(member, "", len(entry) - 1, data=entry[1:]))
                        else:
                            size, _, rel = entry.partition(b":")
                            if rel:
                                name = rel.decode()
                                files.append(SourceFile(member, base + name, int(size), rel=name))
                            else:
                                files.append(SourceFile(member, base + member, int(size)))
                    yield shard, Sample(split_key(files[0].member_name)[0], tuple(files))


def list_file_name(number: int) -> str:
    return f"{LIST_PREFIX}{number:06d}.txt"


def _entry(file: SourceFile) -> bytes:
    """A member's entry in a listing line (module doc)."""
    member = file.member_name.encode()
    if file.data is not None:
        if b"\0" in file.data or b"\n" in file.data:
            raise ValueError(f"{file.member_name!r}: a made member's bytes must hold no NUL or line break")
        return b"%s\0=%s" % (member, file.data)
    if file.rel is not None:
        return b"%s\0%d:%s" % (member, file.size or 0, file.rel.encode())
    return _FILE_ENTRY % (member, file.size or 0)


_FILE_ENTRY = b"%s\0%d"  # the usual entry: member name and size (write_listing makes it inline too)


def sample_tar_bytes(sample: Sample) -> int:
    """Bytes the sample takes in a tar shard (headers and padding), as the writer counts them."""
    total = 0
    for file in sample.files:
        size = file.size or 0
        total += member_header_size(file.member_name, size) + size + (-size & (BLOCK_BYTES - 1))
    return total


def plan_shards(samples: Iterator[Sample], limits: ShardLimits) -> Iterator[tuple[bool, Sample]]:
    """``(starts_a_shard, sample)``: the writer's rule (``limits``) applied to listed sizes."""
    shard_bytes = shard_samples = 0
    for sample in samples:
        size = sample_tar_bytes(sample)
        new = shard_samples == 0 or limits.ends_before(shard_bytes, shard_samples, size)
        if new:
            shard_bytes = shard_samples = 0
        shard_bytes += size
        shard_samples += 1
        yield new, sample


# -- writing the listing, once per pack -------------------------------------------------------


def write_listing(
    store: Store,
    spec,
    samples: Iterator[Sample],
    problems: list[Problem],
    *,
    shuffle_samples: int,
    files_from_sha1: str | None = None,
    classes: ClassCounts | None = None,
    labels_sha1: str | None = None,
) -> Listing:
    """Plan ``samples`` into shards and write the listing files, then ``problems.jsonl``, the
    ``classes`` of a labelled pack (filled by the time ``samples`` ends) and ``list-done.json``
    (last: its presence means the listing is complete)."""
    if spec.shuffle:
        samples = shuffle_buffer(samples, capacity_samples=shuffle_samples, rng=random.Random(f"{spec.seed}"))
    files_meta: list[tuple[int, int, int]] = []
    num_files = num_samples = num_bytes = 0
    body: list[bytes] = []
    shard_samples: list[int] = []
    first_shard = files_flushed = 0

    def flush() -> None:
        nonlocal first_shard, files_flushed
        header = json.dumps({"first_shard": first_shard, "shard_samples": shard_samples}).encode()
        store.write_bytes(list_file_name(len(files_meta)), b"\n".join([header, *body]))
        files_meta.append((first_shard, len(shard_samples), num_files - files_flushed))
        first_shard += len(shard_samples)
        body.clear()
        shard_samples.clear()
        files_flushed = num_files

    for new, sample in plan_shards(samples, spec.limits):
        if new:
            if num_files - files_flushed >= LIST_FILE_ENTRIES:
                flush()
            shard_samples.append(0)
        shard_samples[-1] += 1
        entries = []
        for file in sample.files:
            if file.data is None:  # members pack made (file.data) are not files
                size = file.size or 0
                num_files += 1
                num_bytes += size
                # the usual entry made here, not by a call a file (a tenth of a local listing's CPU)
                entries.append(_FILE_ENTRY % (file.member_name.encode(), size) if file.rel is None else _entry(file))
            else:
                entries.append(_entry(file))
        body.append(b"\0".join(entries))
        num_samples += 1
    if shard_samples:
        flush()
    store.write_bytes(LISTING_PROBLEMS, b"".join(json.dumps(p.to_json()).encode() + b"\n" for p in problems))
    if classes is not None:
        write_classes(store, classes.names, classes.counts)
    listing = Listing(
        spec_digest=spec.digest,
        num_files=num_files,
        num_samples=num_samples,
        num_shards=first_shard,
        payload_bytes=num_bytes,
        files=tuple(files_meta),
        files_from_sha1=files_from_sha1,
        labels_sha1=labels_sha1,
    )
    store.write_bytes(LISTING_DONE, listing.to_json())
    return listing


def read_listing_problems(store: Store) -> list[Problem]:
    if not store.exists(LISTING_PROBLEMS):
        return []
    return [Problem.from_json(json.loads(line)) for line in store.read_bytes(LISTING_PROBLEMS).splitlines() if line]


class _Heartbeat:
    """Rewrites the listing lock every ``HEARTBEAT_S`` while this process lists."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="shardstream-list-lock", daemon=True)

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=HEARTBEAT_S)

    def _run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.store.write_bytes(LISTING_LOCK, _lock_doc())
            except Exception:  # noqa: BLE001 - a missed beat only lets a waiter list too
                pass


def _lock_doc() -> bytes:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode()


def ensure_listing(
    store: Store,
    spec,
    *,
    list_path: str | None,
    on_problem: OnProblem,
    shuffle_samples: int,
    s3=None,
    requests=None,
    wait_poll_s: float = WAIT_POLL_S,
    stale_lock_s: float = STALE_LOCK_S,
) -> Listing:
    """The pack's listing: read when done, else made here (or awaited while another part
    makes it, taken over when that part stops beating).

    Raises:
        the errors of ``on_problem`` (``on_error="raise"``), store errors, and
        DestinationError: ``--files-from`` was given but another part made the listing without it.
    """
    list_sha1 = None if list_path is None else _sha1_of(list_path)
    while True:
        if store.exists(LISTING_DONE):
            listing = Listing.load(store, spec.digest)
            if list_sha1 is not None and listing.files_from_sha1 not in (None, list_sha1):
                raise DestinationError(
                    f"{store.url}: the --files-from list changed since this pack listed it; restore it, "
                    "or pack again with --overwrite"
                )
            if spec.labels_from is not None:
                labels_sha1 = hashlib.sha1(read_label_bytes(spec.labels_from, s3=s3, requests=requests)).hexdigest()
                if listing.labels_sha1 not in (None, labels_sha1):
                    raise DestinationError(
                        f"{spec.labels_from}: the labels file changed since this pack listed SOURCE with it (its "
                        "shards are planned); restore it, or pack again with --overwrite"
                    )
            return listing
        if store.create_exclusive(LISTING_LOCK, _lock_doc()) or _stale(store, stale_lock_s):
            store.write_bytes(LISTING_LOCK, _lock_doc())
            break
        time.sleep(wait_poll_s)
    if spec.files_from and list_path is None:
        raise DestinationError(
            f"{store.url}: this pack lists --files-from and its listing is not done; give --files-from again"
        )
    problems: list[Problem] = []

    def collect(problem: Problem) -> None:
        on_problem(problem)
        problems.append(problem)

    cap = _WarningCap(collect, spec.source)
    labelled = spec.labels_from_dirs or spec.labels_from is not None
    classes = ClassCounts() if labelled else None
    try:
        with _Heartbeat(store):
            labels = labels_sha1 = None
            if spec.labels_from is not None:  # read when listed: a fix after a failed listing is taken up
                data = read_label_bytes(spec.labels_from, s3=s3, requests=requests)
                labels, labels_sha1 = parse_label_file(spec.labels_from, data, cap), hashlib.sha1(data).hexdigest()
            if classes is not None:
                samples = walk_labelled(
                    spec.source,
                    on_problem=cap,
                    classes=classes,
                    s3=s3,
                    requests=requests,
                    labels=labels,
                    pinned=spec.classes,
                )
            else:
                samples = iter_source_samples(
                    spec.source, list_path=list_path, on_problem=cap, s3=s3, requests=requests
                )
            return write_listing(
                store,
                spec,
                cap.flushed_after(samples),
                problems,
                shuffle_samples=shuffle_samples,
                files_from_sha1=list_sha1,
                classes=classes,
                labels_sha1=labels_sha1,
            )
    finally:  # a rerun (after a fix, on_error="raise") lists again at once
        with contextlib.suppress(FileNotFoundError):
            store.delete(LISTING_LOCK)


class _WarningCap:
    """Passes problems on, but of each kind in ``_CAPPED_KINDS`` only the first
    :data:`WARNINGS_LISTED`; one entry (``count``: how many) stands for the rest of a kind, once
    the walk is over (so the problems held stay few where every sample has one)."""

    def __init__(self, forward: OnProblem, source: str) -> None:
        self.forward, self.source = forward, source
        self.seen: dict[ProblemKind, int] = {}

    def __call__(self, problem: Problem) -> None:
        if problem.kind in _CAPPED_KINDS:
            self.seen[problem.kind] = self.seen.get(problem.kind, 0) + 1
            if self.seen[problem.kind] > WARNINGS_LISTED:
                return
        self.forward(problem)

    def flushed_after(self, samples: Iterator[Sample]) -> Iterator[Sample]:
        yield from samples
        for kind, seen in self.seen.items():
            if seen > WARNINGS_LISTED:
                more = seen - WARNINGS_LISTED
                self.forward(
                    Problem(
                        self.source,
                        kind,
                        f"{more} more like the {WARNINGS_LISTED} listed above (not listed one by one)",
                        count=more,
                    )
                )


def read_label_bytes(path: str, *, s3=None, requests=None) -> bytes:
    """The bytes of a ``--labels-from`` file (a local path or a store URL).

    Raises:
        SourceNotFoundError: there is none.
    """
    try:
        if is_remote_url(path):
            root, name = split_url(path)
            return open_store(root, s3=s3, requests=requests).read_bytes(name)
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise SourceNotFoundError(f"{path}: no such labels file (check --labels-from)") from None


def _sha1_of(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _stale(store: Store, stale_lock_s: float) -> bool:
    """Whether the listing lock was left by a lister that stopped beating (or is unreadable)."""
    try:
        doc = json.loads(store.read_bytes(LISTING_LOCK))
        beat, host, pid = float(doc["time"]), doc["host"], int(doc["pid"])
    except FileNotFoundError:
        return False
    except Exception:  # noqa: BLE001 - a damaged lock: whoever reads it next relists
        return True
    if host == socket.gethostname() and pid != os.getpid():  # a lister on this machine: is it alive?
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    return time.time() - beat > stale_lock_s
