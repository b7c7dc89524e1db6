"""The running of ``pack-text``'s streams (:func:`shardstream.tokens.pack.pack_tokens`): the options
that decide the tokens (:class:`TextOptions`), one stream's job and result, its journal records
and the shard in progress, :func:`run_text_stream` (read a stream's chunks from where it stopped,
tokenize batches, publish and record shards), and running the streams inline, in spawned worker
processes or as Ray tasks, with one progress bar."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from ..config import FetchConfig, RequestConfig, S3Config, set_env
from ..errors import DestinationError, IndexFormatError, ShardstreamError, SourceError, UnreadableFileError
from ..index.status import SPEC_NAME, STATE_DIR
from ..packing.destination import open_destination
from ..packing.journal import (
    PackSpec,
    StreamRecord,
    recorded_streams,
    remove_stream_partials,
)
from ..packing.workers import run_in_processes
from ..storage import Store, open_store
from .format import TokenShardRow, token_dtype
from .records import read_chunk
from .sources import (
    EMPTY,
    NEVER_STOPS,
    TOKENIZER_ERROR,
    UNREADABLE,
    Chunk,
    TextProblem,
)
from .tokenize import TextTokenizer
from .writer import LengthHistogram, write_token_shard


@dataclass(frozen=True, kw_only=True)
class TextOptions:
    """What decides the tokens beyond the :class:`PackSpec` (recorded in ``text.json``)."""

    text_field: str
    id_field: str | None
    tokenizer: str  # TextTokenizer.identity: the tokenizer.json's sha256, or the callable's name
    tokenizer_info: str  # what tokens.bin records of it (JSON)
    vocab_size: int
    eod_id: int | None
    max_shard_tokens: int
    chunk_bytes: int

    def differences(self, other: TextOptions) -> str:
        return "; ".join(
            f"{k}: {getattr(self, k)!r} recorded, {getattr(other, k)!r} given"
            for k in asdict(self)
            if getattr(self, k) != getattr(other, k)
        )


def _check(problem: TextProblem, on_error: str) -> None:
    """Raise for a problem that stops the pack under ``on_error="raise"``."""
    if on_error == "skip" or problem.kind in NEVER_STOPS:
        return
    cls = UnreadableFileError if problem.kind == UNREADABLE else SourceError
    raise cls(
        f"{problem.where}: {problem.reason} ({problem.kind}); fix it and run the same command again to resume, "
        "or pass --on-error skip to pack the rest and report it"
    )


# ------------------------------------------------------------------------------------------ one stream


@dataclass(frozen=True, kw_only=True)
class TextJob:
    """One stream's work: its chunks, in order, and everything needed to pack them."""

    spec: PackSpec
    options: TextOptions
    stream: int
    dest: str
    chunks: tuple[Chunk, ...]
    root: str | None
    tokenizer: TextTokenizer
    on_error: str
    batch_size: int
    s3: S3Config | None = None
    fetch: FetchConfig | None = None
    requests: RequestConfig | None = None


@dataclass
class TextStreamResult:
    num_docs: int = 0
    num_tokens: int = 0
    num_shards: int = 0
    resumed: bool = False
    problems: list[TextProblem] = field(default_factory=list)


@dataclass(frozen=True)
class _StreamState:
    num_shards: int
    chunk: int  # chunks of the stream's list done
    within: int  # units of the next chunk consumed
    done: bool


def _record_name(stream: int, seq: int | None) -> str:
    return StreamRecord.name(stream, seq)


def _load_record(store: Store, spec: PackSpec, stream: int, seq: int | None) -> dict[str, Any]:
    """A stream's record (``seq`` None: its done record), checked.

    Raises:
        IndexFormatError: damaged, written under other options, or not a pack-text record.
    """
    url = store.url_of(_record_name(stream, seq))
    try:
        doc = json.loads(store.read_bytes(_record_name(stream, seq)).partition(b"\n")[0])
        text = doc["text"]
        if seq is not None:
            TokenShardRow(**{**text["row"], "members": tuple(tuple(m) for m in text["row"]["members"])})
    except (ValueError, KeyError, TypeError) as exc:
        raise IndexFormatError(f"{url}: damaged pack-text record ({exc!r}); pack again with --overwrite") from exc
    if doc.get("spec") != spec.digest:
        raise IndexFormatError(
            f"{url}: written by a pack with other options than {store.url_of(SPEC_NAME)} (parts started with "
            "different options?); pack again with --overwrite and the same options for every part"
        )
    return doc


def _stream_state(store: Store, spec: PackSpec, stream: int) -> _StreamState:
    seqs, done = recorded_streams(store, f"{STATE_DIR}/s{stream:05d}-").get(stream, ([], False))
    seqs.sort()
    if seqs != list(range(len(seqs))):
        raise DestinationError(f"{store.url}: pack records of stream {stream} have gaps; pack again with --overwrite")
    if done:
        return _StreamState(len(seqs), 0, 0, True)
    if not seqs:
        return _StreamState(0, 0, 0, False)
    last = _load_record(store, spec, stream, seqs[-1])
    return _StreamState(len(seqs), int(last["consumed"]), int(last["within"]), False)


class _ShardBuilder:
    """The shard in progress of one stream: documents added in pieces (numpy slices of a
    batch), published and recorded when full."""

    def __init__(self, store: Store, job: TextJob, state: _StreamState, result: TextStreamResult) -> None:
        self.store, self.job, self.result = store, job, result
        self.spec, self.stream = job.spec, job.stream
        self.seq = state.num_shards
        self.max_tokens = job.options.max_shard_tokens
        self.position = (state.chunk, state.within)  # (chunk, units of it consumed) after what is held
        self.pieces: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.ids: list[str] = []
        self.num_tokens = 0
        self.problems: list[TextProblem] = []  # met since the last record

    def add(self, tokens: np.ndarray, lengths: np.ndarray, ids: list[str]) -> None:
        if len(lengths):
            self.pieces.append(tokens)
            self.lengths.append(lengths)
            self.ids.extend(ids)
            self.num_tokens += len(tokens)

    def publish(self) -> None:
        """Write the shard held (if any) and its record."""
        if not self.ids:
            return
        lengths = np.concatenate(self.lengths)
        tokens = np.concatenate(self.pieces) if len(self.pieces) > 1 else self.pieces[0]
        name = self.spec.shard_name(self.stream, self.seq)
        row = write_token_shard(self.store, name, tokens, lengths, self.ids)
        histogram = LengthHistogram()
        histogram.add(lengths)
        self._save(
            self.seq,
            {
                "name": name,
                "bytes": row.bytes,
                "num_samples": 1,
                "num_members": len(row.members),
                "crc32": f"{row.crc32:08x}",
            },
            {"row": {**asdict(row), "members": [list(m) for m in row.members]}, "lengths": histogram.to_json()},
        )
        self.result.num_shards += 1
        self.seq += 1
        self.pieces, self.lengths, self.ids, self.num_tokens = [], [], [], 0

    def finish(self) -> None:
        """Publish the last shard, then the stream's done record."""
        self.publish()
        self._save(None, None, {})

    def _save(self, seq: int | None, shard: dict[str, Any] | None, extra: dict[str, Any]) -> None:
        doc = {
            "stream": self.stream,
            "seq": self.seq if seq is None else seq,
            "consumed": self.position[0],
            "within": self.position[1],
            "last_key": None,
            "spec": self.spec.digest,
            "problems": [],  # pack's problems: pack-text keeps its own under "text"
            "shard": shard,
            "text": {**extra, "problems": [p.to_json() for p in self.problems]},
        }
        self.store.write_bytes(_record_name(self.stream, seq), json.dumps(doc).encode() + b"\n")
        self.problems = []


def run_text_stream(job: TextJob, advance: Any) -> TextStreamResult:
    """Pack one stream (module doc), resuming after its last record; ``advance(docs, tokens)``
    is told of each batch written."""
    store = open_destination(job.dest, s3=job.s3, fetch=job.fetch, requests=job.requests)
    state = _stream_state(store, job.spec, job.stream)
    result = TextStreamResult(resumed=state.num_shards > 0 or state.done)
    if state.done:
        return result
    remove_stream_partials(store, job.spec, job.stream)
    source = open_store(job.root, s3=job.s3, requests=job.requests) if job.root is not None else None
    builder = _ShardBuilder(store, job, state, result)
    batch: list[tuple[int, int, str | None, Any]] = []
    docs = 0
    for item in _items(job, state, source):
        batch.append(item)
        if item[2] is not None:
            docs += 1
            if docs >= job.batch_size:
                _write_batch(job, batch, builder, result, advance)
                batch, docs = [], 0
    _write_batch(job, batch, builder, result, advance)
    builder.finish()
    return result


def _items(job: TextJob, state: _StreamState, source: Any) -> Iterator[tuple[int, int, str | None, Any]]:
    """``(chunk, units consumed after it, text or None, id or problem)`` of the stream's
    chunks from where it stopped."""
    options = job.options
    for c in range(state.chunk, len(job.chunks)):
        skip = state.within if c == state.chunk else 0
        for unit, text, value in read_chunk(
            job.chunks[c], skip, text_field=options.text_field, id_field=options.id_field, store=source
        ):
            yield c, unit, text, value


def _encode(job: TextJob, texts: list[str]) -> tuple[list[Any], dict[int, str]]:
    """The ids of each text, and why the tokenizer failed on some (by index): a batch it fails
    on is tokenized again one text at a time, to find the documents it fails on."""
    tokenizer = job.tokenizer
    if not texts:
        return [], {}
    try:
        return tokenizer.encode_lists(texts), {}
    except Exception:  # noqa: BLE001 - retried one by one, to name the document it fails on
        pass
    lists: list[Any] = []
    failed: dict[int, str] = {}
    for i, text in enumerate(texts):
        try:
            lists.append(tokenizer.encode_lists([text])[0])
        except Exception as exc:  # noqa: BLE001 - reported per on_error, naming the document
            lists.append(())
            failed[i] = f"the tokenizer failed: {type(exc).__name__}: {exc}"
    return lists, failed


def _write_batch(
    job: TextJob,
    batch: list[tuple[int, int, str | None, Any]],
    builder: _ShardBuilder,
    result: TextStreamResult,
    advance: Any,
) -> None:
    """Tokenize a batch's documents and hand them, with its problems, to the shard in
    progress in their order (publishing shards as they fill)."""
    if not batch:
        return
    tokenizer = job.tokenizer
    doc_items = [item for item in batch if item[2] is not None]
    lists, failed = _encode(job, [item[2] for item in doc_items])
    ids, lengths = tokenizer.flatten(lists)
    eod = tokenizer.eod_id
    kept = lengths > 0
    if eod is not None:
        ends = np.cumsum(lengths)[kept]
        ids = np.insert(ids, ends, eod)
        final = np.where(kept, lengths + 1, 0)
    else:
        final = lengths
    tokens = ids.astype(token_dtype(tokenizer.vocab_size))
    starts = np.concatenate([[0], np.cumsum(final)]).tolist()
    final_list = final.tolist()
    max_tokens = builder.max_tokens
    seg = 0  # first document of the batch not yet handed to the builder
    segment_ids: list[str] = []  # the ids of those kept among them
    d = 0
    docs_written = tokens_written = 0
    for chunk, unit, text, value in batch:
        if text is None:
            problem = value
        elif d in failed:
            problem = _doc_problem(job, chunk, unit, TOKENIZER_ERROR, failed[d])
            d += 1
        elif not final_list[d]:
            problem = _doc_problem(job, chunk, unit, EMPTY, "no token (empty text)")
            d += 1
        else:
            n = final_list[d]
            held = builder.num_tokens + (starts[d] - starts[seg])
            if held and held + n > max_tokens:  # full: publish it (a longer document gets a shard of its own)
                _hand(builder, tokens, final, starts, seg, d, segment_ids)
                builder.publish()
                seg, segment_ids = d, []
            segment_ids.append(value)
            docs_written += 1
            tokens_written += n
            d += 1
            builder.position = (chunk, unit)
            continue
        _check(problem, job.on_error)
        result.problems.append(problem)
        builder.problems.append(problem)
        builder.position = (chunk, unit)
    _hand(builder, tokens, final, starts, seg, d, segment_ids)
    result.num_docs += docs_written
    result.num_tokens += tokens_written
    advance(docs_written, tokens_written)


def _hand(
    builder: _ShardBuilder,
    tokens: np.ndarray,
    final: np.ndarray,
    starts: list[int],
    seg: int,
    end: int,
    ids: list[str],
) -> None:
    """Hand documents ``seg..end-1`` of the batch (those kept, with ``ids``) to the builder."""
    if not ids:
        return
    lengths = final[seg:end]
    builder.add(tokens[starts[seg] : starts[end]], lengths[lengths > 0], ids)


def _doc_problem(job: TextJob, chunk: int, unit: int, kind: str, reason: str) -> TextProblem:
    c = job.chunks[chunk]
    where = c.first + unit
    if c.file.fmt in ("parquet", "arrow"):
        return TextProblem(c.file.url, kind, reason, row=where - 1)
    return TextProblem(c.file.url, kind, reason, line=where)


# ------------------------------------------------------------------------------------------ running streams


def _run_jobs(jobs: list[TextJob], *, progress: bool) -> list[TextStreamResult]:
    """Run the streams inline (one) or in spawned worker processes, driving one progress bar."""
    bar = tqdm(
        unit=" tokens", unit_scale=True, desc="pack-text", disable=not progress, file=sys.stderr, mininterval=0.5
    )
    docs = 0
    shown_at = 0.0

    def advance(num_docs: int, num_tokens: int) -> None:
        nonlocal docs, shown_at
        docs += num_docs
        bar.update(num_tokens)
        if time.monotonic() - shown_at > 0.5:
            shown_at = time.monotonic()
            bar.set_postfix_str(f"{docs / max(bar.format_dict['elapsed'], 1e-9):,.0f} docs/s", refresh=False)

    try:
        if len(jobs) == 1 and jobs[0].spec.workers == 1:
            return [run_text_stream(jobs[0], advance)]  # the tokenizer's own threads as they are
        return run_in_processes(jobs, _run_alone, advance, name="pack-text", error=_worker_error)
    finally:
        if docs:  # the rate of the whole run, not of the last update
            bar.set_postfix_str(f"{docs / max(bar.format_dict['elapsed'], 1e-9):,.0f} docs/s")
        bar.close()


def _run_alone(job: TextJob, advance: Any) -> TextStreamResult:
    """:func:`run_text_stream` in a worker process or Ray task of its own: one core a worker
    (the tokenizer's own threads off), so N workers use N cores."""
    set_env("TOKENIZERS_PARALLELISM", "false")
    return run_text_stream(job, advance)


def _worker_error(exc: BaseException, stream: int) -> BaseException:
    """A worker's error as the parent raises it: ours (and ValueError) as it is, any other named by its stream."""
    if isinstance(exc, ShardstreamError | ValueError):
        return exc
    return ShardstreamError(f"pack-text stream {stream}: {exc!r}")


def _run_on_ray(jobs: list[TextJob], *, progress: bool) -> list[TextStreamResult]:
    """Each stream as a Ray task (1 CPU; retried when its worker dies, resuming after its last
    record), one progress bar here (:func:`shardstream.packing.ray_run.run_stream_tasks`, as for
    ``pack``).

    Raises:
        the first task's error as raised there; ShardstreamError: a task's worker died on every
        try, or nothing moved for ``STALL_TIMEOUT_S``.
    """
    from ..packing.ray_run import run_stream_tasks

    docs = 0
    with tqdm(unit=" tokens", unit_scale=True, desc="pack-text on Ray", disable=not progress, file=sys.stderr) as bar:

        def tick(num_docs: int, num_tokens: int) -> str:
            nonlocal docs
            docs += num_docs
            bar.update(num_tokens)
            return f"{docs / max(bar.format_dict['elapsed'], 1e-9):,.0f} docs/s"

        return run_stream_tasks(jobs, _run_alone, bar, tick, name="pack-text", stalled="pack-text on Ray")
