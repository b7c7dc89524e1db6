"""One stream of a pack (see :mod:`shardstream.packing.journal`): take this stream's range of
the planned shards from the pack's listing (:mod:`shardstream.packing.listing`), read their
files ahead on a thread pool, write and record the shards, and resume after the last record.
Resharding (``from_shards``) streams input shards ``stream, stream + streams, ...`` instead.
Runs in a worker process (:mod:`.workers`), or inline for ``workers=1``."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import enum
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import (
    DecodeError,
    DestinationError,
    MemberNameError,
    ShardNotFoundError,
    SourceError,
    StorageError,
    UnreadableFileError,
)
from ..format import split_key
from ..shuffle import shuffle_buffer
from ..storage import Store, is_remote_url, open_store
from ..storage.fetch import iter_shard_streams
from ..tarstream import iter_sample_batches
from .destination import open_destination
from .imagecheck import image_problem
from .journal import (
    STATE_DIR,
    JournaledWriter,
    PackSpec,
    StreamState,
    read_stream_state,
    remove_stream_partials,
)
from .listing import Listing
from .merge import load_rows
from .sources import NEVER_STOPS, Problem, ProblemKind, Sample, SourceFile

__all__ = [
    "OnError",
    "StreamJob",
    "StreamResult",
    "check_problem",
    "run_stream",
]


class OnError(enum.Enum):
    """What pack does with a bad input file: stop naming it, or skip and report it.

    ``OnError("raise")`` (the readers' word, :data:`shardstream.config.OnError`) is ``FAIL``
    (``RAISE`` its alias), so one vocabulary serves readers and writers; ``"fail"`` stays
    accepted.
    """

    FAIL = "fail"
    SKIP = "skip"
    RAISE = "fail"  # an alias of FAIL under the readers' word

    @classmethod
    def _missing_(cls, value: object) -> OnError | None:
        return cls.FAIL if value == "raise" else None


@dataclass(frozen=True, kw_only=True)
class StreamJob:
    spec: PackSpec
    stream: int
    dest: str
    list_path: str | None
    on_error: OnError
    shuffle_buffer: int
    s3: S3Config | None
    fetch: FetchConfig | None
    requests: RequestConfig | None = None


@dataclass
class StreamResult:
    num_files: int = 0
    num_samples: int = 0
    payload_bytes: int = 0
    num_shards: int = 0
    resumed: bool = False
    problems: list[Problem] = field(default_factory=list)


def run_stream(job: StreamJob, advance: Callable[[int, int], None]) -> StreamResult:
    """Pack one stream, resuming after its last record."""
    spec, stream = job.spec, job.stream
    store = open_destination(job.dest, s3=job.s3, fetch=job.fetch, requests=job.requests)
    state = read_stream_state(store, spec, stream)
    result = StreamResult(resumed=state.num_shards > 0 or state.done is not None)
    if state.done is not None:
        return result
    if spec.listed:
        return _run_listed(job, store, state, result, advance)
    remove_stream_partials(store, spec, stream)
    mine = _shard_samples(job)
    if spec.shuffle:
        mine = shuffle_buffer(mine, capacity_samples=job.shuffle_buffer, rng=random.Random(f"{spec.seed}/{stream}"))
    mine = _skip_consumed(mine, state, url=store.url_of(STATE_DIR))
    with JournaledWriter(store, spec, stream, state) as journal:
        for sample in mine:
            problems = _undecodable_members(sample) if spec.check_images else []
            for problem in problems:
                check_problem(problem, job.on_error)
            if problems:
                journal.pending.extend(problems)
                result.problems.extend(problems)
            else:
                journal.write_sample(sample.key, sample.members)
                _count(result, sample.members, advance)
            journal.input_done(sample.key)
        journal.finish()
    result.num_shards = journal.num_shards
    return result


def _count(
    result: StreamResult, members: list[tuple[str, bytes]], advance: Callable[[int, int], None], *, made: int = 0
) -> None:
    """Count a sample written: its files (``members`` less the ``made`` ones pack made) and bytes."""
    size = 0
    for _, payload in members:
        size += len(payload)
    result.num_files += len(members) - made
    result.num_samples += 1
    result.payload_bytes += size
    advance(len(members) - made, size)


def _run_listed(
    job: StreamJob, store: Store, state: StreamState, result: StreamResult, advance: Callable[[int, int], None]
) -> StreamResult:
    """Write the stream's range of planned shards (:mod:`shardstream.packing.listing`), from
    the first one it has not recorded."""
    spec, stream = job.spec, job.stream
    listing = Listing.load(store, spec.digest)
    first, end = listing.shard_range(stream, spec.num_streams)
    remove_stream_partials(store, spec, stream, range(first, end))
    earlier = load_rows(store, spec, stream, state.num_shards)
    start = first + state.num_shards
    source_store = open_store(spec.source, s3=job.s3, requests=job.requests) if is_remote_url(spec.source) else None
    shard_of: collections.deque[int] = collections.deque()

    def planned() -> Iterator[Sample]:
        for shard, sample in listing.iter_shards(store, spec.source, start, end):
            shard_of.append(shard)
            yield sample

    current = start
    with JournaledWriter(store, spec, stream, state, first_shard=first) as journal:
        for sample, members, problems in _read_ahead(planned(), source_store, check_images=spec.check_images):
            shard = shard_of.popleft()
            while current < shard:
                journal.end_shard()
                current += 1
            if members:
                journal.write_sample(sample.key, members)
                _count(result, members, advance, made=sum(f.data is not None for f in sample.files))
            for problem in problems:
                check_problem(problem, job.on_error)
            journal.pending.extend(problems)
            result.problems.extend(problems)
            journal.input_done(sample.key)
        while current < end:
            journal.end_shard()
            current += 1
        journal.finish(earlier_rows=earlier)
    result.num_shards = journal.num_shards
    return result


def _skip_consumed(samples: Iterator[Sample], state: Any, *, url: str) -> Iterator[Sample]:
    """Skip what the interrupted run consumed, checking that the input has not changed."""
    last = None
    for _ in range(state.consumed):
        last = next(samples, None)
        if last is None:
            break
    if state.consumed and (last is None or last.key != state.last_key):
        found = "the input ends before it" if last is None else f"it is now {last.key!r}"
        raise DestinationError(
            f"{url}: SOURCE changed since the interrupted pack (sample {state.consumed} was "
            f"{state.last_key!r}, {found}); restore it, or pack again with --overwrite"
        )
    return samples


_ERRORS = {
    ProblemKind.BAD_NAME: MemberNameError,
    ProblemKind.COLLISION: MemberNameError,
    ProblemKind.UNDECODABLE: DecodeError,
    ProblemKind.UNLABELLED: SourceError,
    ProblemKind.METADATA: SourceError,
    ProblemKind.UNKNOWN_CLASS: SourceError,
}


def check_problem(problem: Problem, on_error: OnError) -> None:
    """Raise for a problem that stops the pack under ``on_error="raise"``: MemberNameError for a
    name (or two names that collide), DecodeError for an image that does not decode, SourceError
    for a tree that does not fit ``--labels-from-dirs`` (a file in no class folder, metadata that
    cannot be used), else UnreadableFileError."""
    if problem.packed or problem.kind in NEVER_STOPS or on_error is OnError.SKIP:
        return
    cls = _ERRORS.get(problem.kind, UnreadableFileError)
    if problem.kind is ProblemKind.VANISHED:
        fix = (
            "put it back and run the same command again to resume, pass --on-error skip to pack the rest and "
            "report it, or --overwrite to list SOURCE again (the pack lists it once)"
        )
    else:
        fix = "fix it and run the same command again to resume, or pass --on-error skip to pack the rest and report it"
    raise cls(f"{problem.path!r}: {problem.reason}; {fix}")


class _ShardSample:
    """A sample read from an input shard (resharding): its key, members with their bytes, and
    the shard's URL."""

    __slots__ = ("key", "members", "url")

    def __init__(self, key: str, members: list[tuple[str, bytes]], url: str = "") -> None:
        self.key, self.members, self.url = key, members, url


def _undecodable_members(sample: _ShardSample) -> list[Problem]:
    """``--check-images`` on a sample of an input shard: a problem per image member that does
    not decode (the first with the sample's class, when it has a ``cls`` member)."""
    problems = []
    for name, payload in sample.members:
        reason = image_problem(name, payload)
        if reason is not None:
            problems.append(
                Problem(
                    f"{sample.url}:{name}",
                    ProblemKind.UNDECODABLE,
                    f"does not decode as an image: {reason}; its sample {sample.key!r} is not packed",
                    cls=None if problems else _class_of(sample.members),
                )
            )
    return problems


def _class_of(members: list[tuple[str, bytes]]) -> int | None:
    """The class index a sample's ``cls`` member holds, or None."""
    for name, payload in members:
        if split_key(name)[1] == "cls":
            try:
                return int(payload)
            except ValueError:
                return None
    return None


def _shard_samples(job: StreamJob) -> Iterator[Any]:
    """This stream's samples when SOURCE is tar shards: those of input shards ``stream``,
    ``stream + streams``, ... in order, streamed (gzip and zstd decompressed), members named
    as they were (key and extension)."""
    from .build import shard_urls_of

    spec = job.spec
    urls = shard_urls_of([spec.source], s3=job.s3, requests=job.requests)[job.stream :: spec.num_streams]
    for url, stream in iter_shard_streams(urls, s3=job.s3, requests=job.requests, fetch=job.fetch):
        for batch in iter_sample_batches(stream, url=url, foreign=True):
            for sample in batch:
                key = sample["__key__"]
                yield _ShardSample(
                    key,
                    [
                        (f"{key}.{ext}" if ext else key, payload)
                        for ext, payload in sample.items()
                        if ext not in ("__key__", "__shard__")
                    ],
                    url,
                )


def _read_file(file: SourceFile, source_store: Store | None) -> tuple[bytes | None, Problem | None]:
    try:
        if source_store is not None:
            data = source_store.read_bytes(file.path[len(source_store.url) + 1 :])
            expected = len(data)  # one GET: the object as it is now
        else:
            data, expected = _read_local(file.path)
    except (FileNotFoundError, ShardNotFoundError):
        return None, Problem(file.path, ProblemKind.VANISHED, "vanished before it was read")
    except StorageError:
        raise  # an outage or rejected credentials is not a bad input file: stop
    except OSError as exc:
        return None, Problem(file.path, ProblemKind.UNREADABLE, f"cannot read: {exc.strerror or exc}")
    if len(data) != expected:
        return None, Problem(
            file.path, ProblemKind.CHANGED, f"changed size while packing ({expected} -> {len(data)} bytes)"
        )
    if not data:
        return data, Problem(file.path, ProblemKind.EMPTY, "zero bytes (packed)")
    if file.size is not None and len(data) != file.size:
        return data, Problem(
            file.path,
            ProblemKind.RESIZED,
            f"changed size since the pack listed SOURCE ({file.size} -> {len(data)} bytes): packed as it is now",
        )
    return data, None


def _read_local(path: str) -> tuple[bytes, int]:
    """A local file's bytes to its end, and its size when opened (``open(path, "rb").read()``
    and its ``fstat``, in fewer calls: one read where the file is as large as it was)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        expected = os.fstat(fd).st_size
        data = os.read(fd, expected + 1)
        if len(data) != expected:  # it grew or shrank since: read on to its end
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return data, expected


def _read_sample(
    sample: Sample, source_store: Store | None, *, check_images: bool = False
) -> tuple[list[tuple[str, bytes]], list[Problem]]:
    """A sample's members with their bytes, and the problems met. Members pack made (``cls``,
    ``json``) are not written without a file member; with ``check_images``, a sample with an
    image that does not decode is left out whole. Where a labelled sample is left out, its first
    problem carries its class (``Problem.cls``)."""
    members: list[tuple[str, bytes]] = []
    problems: list[Problem] = []
    files_read = undecodable = 0
    for file in sample.files:
        if file.data is not None:
            members.append((file.member_name, file.data))
            continue
        data, problem = _read_file(file, source_store)
        if check_images and data is not None:
            reason = image_problem(file.member_name, data)
            if reason is not None:
                others = [f.member_name for f in sample.files if f is not file]
                also = f" (with {', '.join(map(repr, others))})" if others else ""
                problem = Problem(
                    file.path,
                    ProblemKind.UNDECODABLE,
                    f"does not decode as an image: {reason}; its sample {sample.key!r}{also} is not packed",
                )
                undecodable += 1
        if problem is not None:
            problems.append(problem)
        if data is not None:
            members.append((file.member_name, data))
            files_read += 1
    if undecodable or not files_read:
        members = []
    if not members and problems:
        cls = _class_of([(f.member_name, f.data) for f in sample.files if f.data is not None])
        if cls is not None:
            first = next((i for i, p in enumerate(problems) if not p.packed), None)
            if first is not None:
                problems[first] = dataclasses.replace(problems[first], cls=cls)
    return members, problems


def _with_sizes(sample: Sample) -> Sample:
    """Stat the files of a sample this stream reads (the walk leaves sizes to the reader,
    so each file is stat-ed by one stream only); the read-ahead budget needs them."""
    if all(file.size is not None or file.data is not None for file in sample.files):
        return sample  # the listing gave every size
    files = []
    for file in sample.files:
        if file.size is None and file.data is None:
            try:
                file = SourceFile(file.member_name, file.path, os.stat(file.path).st_size, rel=file.rel)
            except OSError:
                pass  # reading it will report why
        files.append(file)
    return Sample(sample.key, tuple(files))


_LOCAL_THREADS = 4
_LOCAL_BATCH_SAMPLES = 32
_LOCAL_BATCH_BYTES = 4 << 20


def _read_ahead(
    samples: Iterator[Sample],
    source_store: Store | None,
    *,
    max_inflight_bytes: int = 64 << 20,
    check_images: bool = False,
) -> Iterator[tuple[Sample, list[tuple[str, bytes]], list[Problem]]]:
    """Read samples' files on a thread pool, ahead of the writer, in order; at most
    ``max_inflight_bytes`` of file data (by listed size) are read ahead. With
    ``check_images``, image members are decoded there too (Pillow releases the GIL).

    Local files are read in batches of up to 32 samples or 4 MiB per task (a task per small
    file costs more than reading it from the page cache); S3 objects one per task, 32 at once.
    """
    threads, batch_samples = (32, 1) if source_store is not None else (_LOCAL_THREADS, _LOCAL_BATCH_SAMPLES)
    ahead: collections.deque[tuple[int, concurrent.futures.Future[Any]]] = collections.deque()
    inflight = 0

    def read_batch(batch: list[Sample]) -> list[tuple[Sample, list[tuple[str, bytes]], list[Problem]]]:
        return [(sample, *_read_sample(sample, source_store, check_images=check_images)) for sample in batch]

    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shardstream-read") as pool:
        try:
            batch: list[Sample] = []
            batch_bytes = 0
            for sample in samples:
                if source_store is None:
                    sample = _with_sizes(sample)
                batch.append(sample)
                for file in sample.files:
                    batch_bytes += file.size or 0
                if len(batch) < batch_samples and batch_bytes < _LOCAL_BATCH_BYTES:
                    continue
                ahead.append((batch_bytes, pool.submit(read_batch, batch)))
                inflight += batch_bytes
                batch, batch_bytes = [], 0
                while ahead and (inflight > max_inflight_bytes or len(ahead) > 2 * threads):
                    done_bytes, future = ahead.popleft()
                    inflight -= done_bytes
                    yield from future.result()
            if batch:
                ahead.append((batch_bytes, pool.submit(read_batch, batch)))
            while ahead:
                yield from ahead.popleft()[1].result()
        finally:
            for _, future in ahead:
                future.cancel()
