"""The reading engine: a worker's plan in, batches of samples out. No torch.

:class:`ReadingEngine` reads the shards of a :class:`~shardstream.reading.shards.ShardSet`
through :func:`~shardstream.storage.fetch.iter_shard_streams` (local shards in place, S3
shards as ranged GETs running ahead, the node cache) and hands samples on in
:class:`~shardstream.tarstream.Batch` es. It knows nothing of torch, ranks or epochs: what to
read comes in as a :class:`~shardstream.reading.plan.WorkerPlan` (exact epochs, from the
schedule, :mod:`.schedule`) or as a list of shard ids (bare shard URLs, or resampling).

What it promises:

- **Order.** :meth:`ReadingEngine.read_plan` yields exactly the plan's samples in the plan's
  emission order (:meth:`WorkerPlan.emissions`), less the first ``plan.skip`` (a resume): the
  same samples in the same order on every run, whatever the timing of reads. Each lane
  reads its runs in order; the lanes' arrivals are interleaved as the plan draws them.
  :meth:`ReadingEngine.read_shards` yields every sample of the shards, shard after shard,
  in each shard's order.
- **Bounded memory.** Bytes fetched and not yet consumed stay within the fetch config's
  ``max_buffer_bytes``, which readers that share it (a rank's workers, :func:`share_buffer`;
  a mixture's sources; a reader's lanes) cut into parts with one function,
  :func:`~shardstream.storage.producer.share_read_ahead`; a sample that arrived before its
  turn is held only until its turn, at most ``plan.capacity`` (the shuffle buffer) of them;
  per-shard tables are held for the runs read ahead (``max_inflight_shards + 1``) and the
  runs cut from a shard.
  Nothing is listed per sample up front: a plan of 10^8 samples costs what one of 10^4
  does before its first sample, but for its runs (O(shards)).
- **Errors.** A malformed or truncated shard, one whose samples, keys or sizes disagree
  with the index, or (``verify_checksums``) whose CRC-32 does not match, raises
  :class:`~shardstream.errors.CorruptShardError` naming the shard URL (and member and byte
  where known). With ``on_error="skip"`` the rest of that run is yielded as ``None``
  placeholders instead (logged once), which :func:`repeat_over_skips` replaces by repeats, so
  counts hold. Storage errors (missing shards, S3 access, connections) always raise.
"""

from __future__ import annotations

import collections
import itertools
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..config import FetchConfig, OnError, RequestConfig, S3Config, StoreSettings
from ..errors import CorruptShardError, DecodeError, ShardNotFoundError
from ..index import ShardTable
from ..shuffle import shuffle_buffer
from ..storage.base import is_remote_url
from ..storage.cache import ShardCache
from ..storage.fetch import iter_shard_streams
from ..storage.producer import lane_fetch, share_buffer, source_fetch
from ..tarstream import Batch, Hashed, ShardStream, iter_sample_batches, stream_chunks
from .filerun import FileRun
from .mixplan import MixWorkerPlan
from .plan import PlanRun, WorkerPlan, ramp_samples, without
from .repeat import Repeater
from .shards import ItemTable, ShardSet
from .slicer import RunSlices, iter_sliced_batches
from .stats import ReaderStats

__all__ = ["ReadingEngine", "lane_fetch", "read_mixed", "repeat_over_skips", "share_buffer", "shuffled", "source_fetch"]

log = logging.getLogger("shardstream")
_OUT_BATCH = 64  # samples a shuffling reader hands on (and counts) together
_RUNS_AT_ONCE = 4096  # runs of a lane whose URLs, sizes and ranges are made together (memory, first sample)


class ReadingEngine:
    """Reads shards of ``shards`` into batches of samples (module doc: order, memory, errors).

    Args:
        shards: the shards, their URLs, sizes, counts and tables.
        store: how the shards are reached (:class:`~shardstream.config.StoreSettings`: S3
            endpoint, request policy, node cache and its bound in bytes); None: the defaults,
            or the same settings given one by one (``s3``, ``requests``, ``cache_dir``,
            ``cache_limit_bytes``, as before ``store``).
        on_error: ``"raise"``: a corrupt shard raises; ``"skip"``: the rest of its run is
            yielded as ``None`` placeholders.
        verify_checksums: check each shard read whole against its CRC-32.

    Samples are dicts ``{"__key__": str, "__shard__": shard URL, "<ext>": bytes, ...}``.

    Raises:
        ValueError: ``cache_dir`` without a positive ``cache_limit_bytes``.
    """

    def __init__(
        self,
        shards: ShardSet,
        *,
        store: StoreSettings | None = None,
        on_error: OnError = "raise",
        verify_checksums: bool = False,
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        cache_dir: str | None = None,
        cache_limit_bytes: int | None = None,
    ) -> None:
        if store is None:
            store = StoreSettings(s3=s3, requests=requests, cache_dir=cache_dir, cache_limit_bytes=cache_limit_bytes)
        self.shards, self.store, self.on_error, self.verify_checksums = shards, store, on_error, verify_checksums

    s3 = property(lambda self: self.store.s3, doc="S3 endpoint and credentials; None: the AWS environment.")
    requests = property(lambda self: self.store.requests, doc="The request policy of remote reads, or None.")
    cache_dir = property(lambda self: self.store.cache_dir, doc="The node cache's directory, or None.")
    cache_limit_bytes = property(lambda self: self.store.cache_limit_bytes, doc="The node cache's bound, in bytes.")

    def __repr__(self) -> str:
        return f"ReadingEngine({self.shards!r}, on_error={self.on_error!r})"

    def read_plan(
        self, plan: WorkerPlan, *, fetch: FetchConfig, stats: ReaderStats, file_runs: bool = False
    ) -> Iterator[Batch | FileRun]:
        """A worker's samples in its plan's emission order, in batches, skipping those
        delivered before a resume: each lane reads its runs (byte ranges of shards, from the
        index), arrivals follow the plan's interleaving, and a sample is held only until its
        turn comes, at most ``shuffle_buffer`` of them. Nothing is listed per sample up front:
        the interleaving and the emission order are drawn as samples come, so a piece of 10^8
        samples costs what one of 10^4 does before its first sample, but for its runs
        (O(shards)). One lane in arrival order (``shuffle=False``) hands its batches on as
        they are read.

        With ``file_runs``, such a reader hands on each run of a local shard with a table
        whose samples all hold the same members as a :class:`~.filerun.FileRun`, unread, for
        the consumer to read straight into its own buffers (its other runs, and every run of
        a reader that mixes lanes or shuffles, as batches)."""
        if plan.skip >= plan.count:
            return
        labels: Iterator[np.ndarray] = plan.labels()
        lane_runs = [plan.lane_runs(lane) for lane in range(plan.lanes)]
        if plan.lanes > 1:  # each lane gets its share of the reader's read-ahead bounds
            fetch = lane_fetch(fetch, plan.lanes)
        if plan.lanes == 1 and (plan.capacity <= 1 or plan.count <= 1):  # arrival order, one lane
            if plan.skip:
                lane_runs[0] = without(lane_runs[0], np.arange(plan.skip, dtype=np.int64))
            yield from self._read_runs(lane_runs[0], fetch, stats, file_runs=file_runs)
            return
        skipped = np.zeros(0, dtype=bool)  # by arrival index: delivered before the resume
        emissions = plan.emissions()
        if plan.skip:  # a resume: where the buffer stood, worked out at once, not stepped through
            skipped, emissions = plan.resumed_emissions()
            head: list[np.ndarray] = []
            while sum(map(len, head)) < len(skipped):
                head.append(next(labels))
            prefix = np.concatenate(head)[: len(skipped)]
            for lane in range(plan.lanes):  # each lane leaves out its delivered samples
                lane_runs[lane] = without(lane_runs[lane], np.flatnonzero(skipped[prefix == lane]))
            labels = itertools.chain(head, labels)
        pulled = [0]  # payload bytes of the batches the lanes have read
        readers = [self._read_runs(runs, fetch, stats) for runs in lane_runs]
        lanes_samples = [_flatten(reader, pulled) for reader in readers]
        held: dict[int, dict[str, Any] | None] = {}
        out, counted = Batch(), 0
        turn = next(emissions, None)
        t = 0
        for chunk in labels:
            lanes = chunk.tolist()
            if t < len(skipped):  # arrivals delivered before the resume come from no lane
                wanted = np.ones(len(lanes), dtype=bool)
                part = skipped[t : t + len(lanes)]
                wanted[: len(part)] = ~part
                lanes = [lane if w else -1 for lane, w in zip(lanes, wanted.tolist())]
            for lane in lanes:
                if lane >= 0:
                    held[t] = next(lanes_samples[lane])
                    while turn is not None and turn in held:
                        out.append(held.pop(turn))
                        turn = next(emissions, None)
                    if len(out) >= _OUT_BATCH or (out and not counted):  # the first sample goes at once
                        out.nbytes, counted = pulled[0] - counted, pulled[0]
                        yield out
                        out = Batch()
                t += 1
        if out:
            out.nbytes = pulled[0] - counted
            yield out
        for samples in lanes_samples:  # run each to its end: it checks counts, commits cache entries
            for _ in samples:
                raise AssertionError("internal error: a lane read beyond its plan")

    def _read_runs(
        self, runs: list[PlanRun], fetch: FetchConfig, stats: ReaderStats, *, file_runs: bool = False
    ) -> Iterator[Batch | FileRun]:
        """The wanted samples of each run in order, in batches, reading each run as one byte
        range of its shard (the whole shard when the run covers it; else the range from the
        shard's sample table); with ``on_error="skip"``, None for each sample of a run a
        corrupt shard lost.

        Each run's sample table is asked for as its shard's bytes are (remote tables: a GET
        beside the shard's, up to ``max_inflight_shards + 1`` runs ahead), so it is at hand
        when the bytes come; the tables of runs cut from a shard come first (their byte
        ranges are read from them), asked for together."""
        if len(runs) > _RUNS_AT_ONCE:  # a piece of 10^6 shards: its URLs and streams made a window at a time
            for at in range(0, len(runs), _RUNS_AT_ONCE):
                yield from self._read_runs(runs[at : at + _RUNS_AT_ONCE], fetch, stats, file_runs=file_runs)
            return
        shards, counts = self.shards, self.shards.sample_counts
        assert counts is not None  # internal invariant: only planned reads come here
        cache = self._cache()
        tables = _TableRequests(
            shards,
            runs,
            ahead=fetch.max_inflight_shards + 1,
            on_retry=lambda exc: stats.add("retries", 1),
            cache=cache,
        )
        whole = [run.lo == 0 and run.hi == int(counts[run.shard]) - 1 for run in runs]
        ranges: list[tuple[int, int] | None] = [None] * len(runs)
        for r, table in tables.first([r for r, w in enumerate(whole) if not w]):
            ranges[r] = _run_range(table, runs[r].lo, runs[r].hi)
        tables.ask(1)  # the first table's GET goes out before the first shard's
        streams = iter_shard_streams(
            [shards.url(run.shard) for run in runs],
            sizes_bytes=[shards.size_bytes(run.shard) for run in runs],
            byte_ranges=ranges,
            s3=self.s3,
            requests=self.requests,
            fetch=fetch,
            cache=cache,
            stats=stats,
        )
        # The streams come first in the zip, so the generator runs to its end after the last
        # run: that is where it finishes and commits the last shard's cache entry.
        for r, ((url, stream), run, byte_range) in enumerate(zip(streams, runs, ranges)):
            batches = self._read_run(url, stream, run, byte_range, tables.get(r), file_runs=file_runs)
            yield from _skip_corrupt(batches, run, url) if self.on_error == "skip" else batches

    def _read_run(
        self,
        url: str,
        stream: ShardStream,
        run: PlanRun,
        byte_range: tuple[int, int] | None,
        table_of: Callable[[], ShardTable | ItemTable],
        *,
        file_runs: bool = False,
    ) -> Iterator[Batch | FileRun]:
        """The wanted samples of one run, in batches, checked against the index; with
        ``file_runs``, a run of a local shard (read in place, table at hand, the same members
        in every sample, no checksum to verify) as one unread :class:`~.filerun.FileRun`.

        Members are sliced at the offsets of the shard's table (``table_of()``) and each
        header is checked against it (:mod:`shardstream.reading.slicer`); a whole shard whose
        table is missing is read by parsing its tar headers, and its sample count is
        checked."""
        shards, counts = self.shards, self.shards.sample_counts
        assert counts is not None  # internal invariant: runs come from the index
        checked = None
        if self.verify_checksums and byte_range is None and shards.crc32_hex(run.shard) is not None:
            stream = checked = Hashed(stream)  # (shard URLs with tables have no checksum to check)
        try:
            table = table_of()
        except ShardNotFoundError:
            if byte_range is not None:
                raise
            table = None  # a whole shard reads without its table, parsed
        if table is not None and not isinstance(table, ShardTable):  # an item unit's table cuts its items
            chunks = stream_chunks(stream, grouped=True)
            yield from table.batches(chunks, run.indices(), base_offset=byte_range[0] if byte_range else 0, url=url)
        elif table is not None:
            slices = RunSlices(table, run.indices(), url=url)
            path = stream.path  # a local shard's (a cache entry's may be evicted: not those)
            if file_runs and checked is None and path and not is_remote_url(url) and slices.uniform is not None:
                yield FileRun(path, slices)
                return
            yield from iter_sliced_batches(
                stream_chunks(stream, grouped=True), slices, base_offset=byte_range[0] if byte_range else 0
            )
        else:
            yield from _parsed_run(stream, run, url, int(counts[run.shard]), foreign=shards.foreign)
        if checked is not None:
            checked.drain()  # the tar's tail after its end blocks
            if f"{checked.crc32:08x}" != shards.crc32_hex(run.shard):
                raise CorruptShardError(
                    f"{url}: CRC-32 {checked.crc32:08x} but the index says {shards.crc32_hex(run.shard)}; "
                    "the shard's bytes changed after packing, re-pack or re-upload it"
                )

    def read_resampled(
        self, *, seed: int, epoch: int, reader: int, fetch: FetchConfig, stats: ReaderStats
    ) -> Iterator[Batch]:
        """Endless: shards drawn with replacement, weighted by their sample counts (or
        uniformly without an index), 64 at a time so S3 reads run ahead; seeded by ``(seed,
        epoch, reader)``, ``reader`` being the reader's index among the job's readers."""
        rng = np.random.default_rng([seed, epoch, reader, 3])
        if self.shards.sample_counts is not None:
            counts = self.shards.sample_counts.astype(float)
        else:
            counts = np.ones(self.shards.num_shards)
        if counts.sum() == 0:
            raise ValueError("resampled=True needs a dataset with at least one sample")
        p = counts / counts.sum()
        while True:
            yield from self.read_shards(rng.choice(len(counts), size=64, p=p).tolist(), fetch=fetch, stats=stats)

    def read_shards(self, shards: list[int], *, fetch: FetchConfig, stats: ReaderStats) -> Iterator[Batch]:
        """Every sample of these shards (ids), in batches, checked against the index's counts
        when there is one."""
        counts = self.shards.sample_counts
        urls = [self.shards.url(s) for s in shards]
        sizes = [self.shards.size_bytes(s) for s in shards]
        streams = iter_shard_streams(
            urls, sizes_bytes=sizes, s3=self.s3, requests=self.requests, fetch=fetch, cache=self._cache(), stats=stats
        )
        for s, (url, stream) in zip(shards, streams):
            count = 0
            for batch in iter_sample_batches(stream, url=url, foreign=self.shards.foreign):
                count += len(batch)
                yield batch
            if counts is not None and count != counts[s]:
                raise CorruptShardError(
                    f"{url}: holds {count} samples but the index says {counts[s]}; the shard "
                    "or its index is stale or damaged, re-pack or re-upload the dataset"
                )

    def _cache(self) -> ShardCache | None:
        store = self.store
        if store.cache_dir is None or store.cache_limit_bytes is None:  # StoreSettings: both or neither
            return None
        return ShardCache(store.cache_dir, cache_limit_bytes=store.cache_limit_bytes)


def read_mixed(
    engines: Sequence[ReadingEngine],
    plans: Sequence[WorkerPlan],
    mix: MixWorkerPlan,
    *,
    names: Sequence[str],
    fetch: FetchConfig,
    stats: ReaderStats,
) -> Iterator[Batch]:
    """A worker's samples of a mixture, in batches: each source's plan ``plans[s]`` (over its
    real shards) read by ``engines[s]`` (:meth:`ReadingEngine.read_plan`: the source's own
    lanes and shuffle buffer; the worker's read-ahead budget shared by the sources), emitted
    in the order of ``mix.labels()``, less the ``mix.skip`` positions delivered before a
    resume. Each sample gets ``"__source__"``: its source's name. Counts per source go to
    ``stats`` as they are handed on. Each source reads ahead within its share of ``fetch``'s
    bounds (its budget and requests), in proportion to its samples, so the sources read at
    the pace they are consumed within about the reader's budget."""
    pulled = [0]
    total = max(1, sum(plan.count for plan in plans))
    sources = []
    for engine, plan, name in zip(engines, plans, names):
        source = source_fetch(fetch, plan.count / total)
        sources.append(_SourceQueue(engine.read_plan(plan, fetch=source, stats=stats), pulled, name))
    left = mix.skip
    out: list[Any] = []
    counts = np.zeros(len(engines), np.int64)
    counted, first = 0, True
    gathers: dict[bytes, tuple[np.ndarray, list[int]]] = {}
    for chunk in mix.labels():
        if left >= len(chunk):
            left -= len(chunk)
            continue
        chunk, left = chunk[left:], 0
        key = chunk.tobytes()
        if key not in gathers:  # windows repeat a few patterns: work each out once
            if len(gathers) > 4096:
                gathers.clear()
            where = np.empty(len(chunk), np.int64)
            where[np.argsort(chunk, kind="stable")] = np.arange(len(chunk))
            gathers[key] = (np.bincount(chunk, minlength=len(engines)), where.tolist())
        wanted, where_list = gathers[key]
        # The chunk's samples, source by source, then put in the labels' order: a gather in C
        # rather than a Python step per sample.
        grouped = [x for source, n in zip(sources, wanted.tolist()) if n for x in source.take(n)]
        out += map(grouped.__getitem__, where_list)
        counts += wanted
        if len(out) >= _OUT_BATCH or first:  # the first samples go at once
            batch = Batch(out, pulled[0] - counted)
            counted, first, out = pulled[0], False, []
            stats.add_sources(counts)
            counts[:] = 0
            yield batch
    if out:
        stats.add_sources(counts)
        yield Batch(out, pulled[0] - counted)
    for source in sources:  # run each to its end: it checks counts, commits cache entries
        source.finish()


class _SourceQueue:
    """One source's samples of a mixture, taken ``n`` at a time (slices of its batches), each
    tagged ``"__source__": name``; the payload bytes of each batch read are added to
    ``pulled[0]``. A slicer's batch builds its samples as it is iterated, so it is taken in
    when its turn comes, one batch at a time."""

    def __init__(self, batches: Iterator[Batch], pulled: list[int], name: str) -> None:
        self.batches, self.pulled, self.name = batches, pulled, name
        self.held: list[Any] = []
        self.at = 0

    def take(self, n: int) -> list[Any]:
        held, at = self.held, self.at
        if at + n <= len(held):  # the common case: within the batch at hand
            self.at = at + n
            return held[at : at + n]
        out = held[at:]
        while len(out) < n:
            batch = next(self.batches, None)
            if batch is None:
                raise AssertionError(f"internal error: source {self.name!r} ended before its plan")
            self.pulled[0] += batch.nbytes
            held = batch if type(batch) is Batch else list(batch)
            name = self.name
            for sample in held:
                if sample is not None:
                    sample["__source__"] = name
            want = n - len(out)
            out += held[:want]
            self.held, self.at = held, min(want, len(held))
        return out

    def finish(self) -> None:
        if self.at < len(self.held):
            raise AssertionError(f"internal error: source {self.name!r} read beyond its plan")
        for _ in self.batches:
            raise AssertionError(f"internal error: source {self.name!r} read beyond its plan")


def shuffled(batches: Iterator[Batch], *, capacity_samples: int, seed: Sequence[int]) -> Iterator[Batch]:
    """``batches``' samples through a shuffle buffer of ``capacity_samples`` (seeded by
    ``seed``, e.g. ``(seed, epoch, reader)``), in batches of 64: for reads without a plan."""
    state = int(np.random.SeedSequence(list(seed)).generate_state(1)[0])
    return _in_batches(
        shuffle_buffer(
            itertools.chain.from_iterable(batches),
            capacity_samples=capacity_samples,
            rng=random.Random(state),
            initial_samples=ramp_samples(capacity_samples),
        )
    )


def repeat_over_skips(
    batches: Iterator[Batch], decode: Callable[[dict[str, Any]], Any] | None, stats: ReaderStats
) -> Iterator[Batch]:
    """Batches of decoded samples; a skipped (None) or undecodable one is counted and
    replaced by a repeat of the previous good one (or of the next, at the start), so the
    count is kept (:class:`~.repeat.Repeater`)."""
    repeater: Repeater[Any] = Repeater()
    warned: set[str] = set()
    for batch in batches:
        out = Batch(nbytes=batch.nbytes)
        for sample in batch:
            if sample is not None and decode is not None:
                try:
                    sample = decode(sample)
                except DecodeError as exc:
                    shard = str(sample.get("__shard__"))
                    if shard not in warned:
                        warned.add(shard)
                        log.warning("skipping samples of %s: undecodable or lacking a field (first: %s)", shard, exc)
                    sample = None
            if sample is None:
                stats.add("skipped", 1)
            out.extend(repeater.take(sample, skipped=sample is None))
        if out:
            yield out
    if repeater.owed:
        raise CorruptShardError(
            f"on_error='skip': all {repeater.owed} samples of this reader were skipped; nothing to repeat"
        )


def _parsed_run(stream: Any, run: PlanRun, url: str, count: int, *, foreign: bool = False) -> Iterator[Batch]:
    """A run covering a whole shard, read by parsing its tar headers: its wanted samples, in
    batches; the shard must hold ``count`` samples (the index's). ``foreign``: an index built
    for another tool's shards (links skipped, as the index left them out)."""
    wanted = None
    if run.index is not None:
        wanted = np.zeros(count, bool)
        wanted[run.index] = True
    i = 0
    for batch in iter_sample_batches(stream, url=url, foreign=foreign):
        if i + len(batch) > count:
            raise CorruptShardError(
                f"{url}: holds more than the {count} samples the index says; the shard or its index is stale or "
                "damaged, re-pack or re-upload the dataset"
            )
        n = len(batch)
        if wanted is not None:
            kept = [sample for sample, w in zip(batch, wanted[i : i + n].tolist()) if w]
            batch = Batch(kept, sum(map(_payload_bytes, kept)))
        i += n
        if batch:
            yield batch
    if i != count:
        raise CorruptShardError(
            f"{url}: holds {i} samples but the index says {count}; the shard or its index is stale or damaged, "
            "re-pack or re-upload the dataset"
        )


class _TableRequests:
    """The sample tables of a lane's runs, asked for ahead of their turn (:meth:`get`), at most
    ``ahead`` runs ahead, so a remote table's GET runs beside its shard's ranged GETs."""

    def __init__(
        self,
        shards: ShardSet,
        runs: list[PlanRun],
        *,
        ahead: int,
        on_retry: Callable[[BaseException], None] | None = None,
        cache: ShardCache | None = None,
    ) -> None:
        self.shards, self.runs, self.ahead, self.on_retry = shards, runs, ahead, on_retry
        self.cache = cache  # the node cache: remote tables are read from it, or written into it
        self.asked: dict[int, Callable[[], ShardTable]] = {}
        self.next = 0  # the first run not asked for yet

    def first(self, wanted: list[int]) -> Iterator[tuple[int, ShardTable]]:
        """``(run, table)`` for each of the ``wanted`` runs in order, their tables asked for
        up to 64 at a time (and kept for :meth:`get`)."""
        window = 64
        pending = collections.deque()
        for r in wanted:
            pending.append(r)
            self.asked[r] = self.shards.request_table(self.runs[r].shard, on_retry=self.on_retry, cache=self.cache)
            if len(pending) >= window:
                q = pending.popleft()
                yield q, self._kept(q)
        while pending:
            q = pending.popleft()
            yield q, self._kept(q)

    def _kept(self, r: int) -> ShardTable:
        table = self.asked[r]()
        self.asked[r] = lambda: table
        return table

    def ask(self, upto: int) -> None:
        """Ask for the tables of the runs before ``upto`` not asked for yet."""
        while self.next < min(upto, len(self.runs)):
            if self.next not in self.asked:
                self.asked[self.next] = self.shards.request_table(
                    self.runs[self.next].shard, on_retry=self.on_retry, cache=self.cache
                )
            self.next += 1

    def get(self, r: int) -> Callable[[], ShardTable]:
        """Run ``r``'s table, as a function that waits for it; asks for the next runs' tables."""
        self.ask(r + self.ahead)
        return self.asked.pop(r, None) or self.shards.request_table(
            self.runs[r].shard, on_retry=self.on_retry, cache=self.cache
        )


def _run_range(table: ShardTable | ItemTable, lo: int, hi: int) -> tuple[int, int]:
    """The byte range of a shard that holds its samples (or items) ``lo..hi``: from the end
    of the sample before (its headers start there) to the end of the last."""
    if not isinstance(table, ShardTable):
        return table.run_range(lo, hi)
    ends = table.sample_ends()
    return int(ends[lo - 1]) if lo else 0, int(ends[hi])


def _skip_corrupt(batches: Iterator[Batch], run: PlanRun, url: str) -> Iterator[Batch]:
    """A run's batches; from a CorruptShardError on, a batch of ``None`` for each wanted
    sample left (logged once)."""
    done = 0
    try:
        for batch in batches:
            done += len(batch)
            yield batch
    except CorruptShardError as exc:
        log.warning("skipping %d samples of %s: %s", run.count - done, url, exc)
        if run.count > done:
            yield Batch([None] * (run.count - done))


def _flatten(batches: Iterator[Batch], pulled: list[int]) -> Iterator[Any]:
    """The samples of ``batches``, adding each batch's payload bytes to ``pulled[0]``."""
    for batch in batches:
        pulled[0] += batch.nbytes
        yield from batch


def _in_batches(samples: Iterator[dict[str, Any]], size: int = _OUT_BATCH) -> Iterator[Batch]:
    """``samples`` in batches of ``size`` (the last one shorter), their payload bytes counted."""
    batch = Batch()
    for sample in samples:
        batch.append(sample)
        if len(batch) >= size:
            batch.nbytes = sum(map(_payload_bytes, batch))
            yield batch
            batch = Batch()
    if batch:
        batch.nbytes = sum(map(_payload_bytes, batch))
        yield batch


def _payload_bytes(sample: dict[str, Any] | None) -> int:
    if sample is None:
        return 0
    return sum(len(v) for k, v in sample.items() if not k.startswith("__") and isinstance(v, (bytes, bytearray)))
