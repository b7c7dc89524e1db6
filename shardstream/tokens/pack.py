"""``pack_tokens(source, dest, tokenizer=...)`` (``shardstream pack-text``): documents -> token
shards (:mod:`shardstream.tokens.format`) plus ``index.bin`` and ``tokens.bin``, in parallel
processes (or Ray tasks), resumable after a crash, split across machines.

How it runs, reusing ``pack``'s machinery (:mod:`shardstream.packing`):

- **Plan.** SOURCE is listed and cut into chunks (:func:`~shardstream.tokens.sources.make_plan`:
  a file, a run of lines of a big local JSON Lines file, a Parquet row group). The plan is
  recorded once in ``DEST/.shardstream/text.json`` with the options that decide the tokens;
  a rerun (or another part) reuses it after checking that SOURCE lists the same files (names
  and sizes) and the options are the same.
- **Streams.** ``num_streams = parts x workers``; the chunks are dealt to streams by weight
  (:meth:`~shardstream.tokens.sources.Plan.deal`), stream ``s`` belongs to part ``s mod parts``
  (``--part I/N``, or ``RANK`` / ``WORLD_SIZE`` or a job array's variables, as ``pack``). A
  stream reads its chunks in order, tokenizes batches of ``batch_size`` documents, appends the
  end-of-document token, and writes shards of at most ``max_shard_tokens`` tokens (a document
  never splits: a longer one gets a shard of its own) with
  :func:`~shardstream.tokens.writer.write_token_shard`. Shard ``seq`` of stream ``s`` is
  ``NAME-{seq x num_streams + s:06d}.tar``, so names never clash.
- **Journal.** Right after a shard is published its record is written
  (``.shardstream/sSSSSS-QQQQQQQ.json``, the record ``pack`` writes, with the shard's token
  columns, its document-length histogram, the problems met since the last record, and how far
  into its chunks the stream got); ``sSSSSS-done.json`` when the stream is done. A killed
  stream (``kill -9``) resumes after its last record, skipping what it had consumed (without
  tokenizing it again), and writes the same shards: the dataset is byte-identical to an
  uninterrupted run's.
- **Merge.** When every stream of every part is done, whichever run sees it last writes
  ``pack-report.jsonl`` (every problem, in source order), then ``tokens.bin`` and ``index.bin``
  (:func:`~shardstream.tokens.writer.publish_token_index`), the shards in global number order,
  the document-id index ``docids/`` (:func:`~shardstream.tokens.docids.build_docid_index`) and
  ``merged.json``.
- **Destination.** As ``pack``'s (:func:`~shardstream.packing.destination.prepare_state`): a
  DEST holding files with names pack-text writes (shards, tables, ``index.bin``,
  ``tokens.bin``, ``docids/``, the report, ``.shardstream/``) that no index or pack state there
  records is refused (``clobber`` writes over them); ``overwrite`` deletes only what the
  earlier dataset or pack state records.

Shard layout depends only on (SOURCE, the options, ``workers``, parts): ``--part 0/2`` and
``--part 1/2`` with 1 worker each make the dataset one run with ``workers=2`` makes.
"""

from __future__ import annotations

import concurrent.futures
import enum
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config, on_error_of
from ..errors import DestinationError, IndexFormatError, SourceError
from ..index import MANIFEST_NAME, Manifest
from ..index.status import SPEC_NAME, STATE_DIR
from ..packing.destination import check_outside, counted, open_destination, prepare_state, wipe
from ..packing.journal import REPORT_NAME, PackSpec, recorded_streams
from ..packing.merge import record_merged
from ..packing.ownership import refuse_foreign, top_level_names
from ..packing.parts import Part, part_and_workers
from ..storage import Store
from .docids import DOCIDS_DIR, build_docid_index
from .format import TOKENS_INDEX_NAME, TokenManifest, TokenShardRow, token_dtype
from .pack_run import (
    TextJob,
    TextOptions,
    _check,
    _load_record,
    _run_jobs,
    _run_on_ray,
)
from .sources import (
    DEFAULT_CHUNK_BYTES,
    NOT_TEXT,
    Plan,
    TextProblem,
    list_text_files,
    make_plan,
    source_url_of,
)
from .tokenize import TextTokenizer, resolve_tokenizer
from .writer import DEFAULT_MAX_SHARD_TOKENS, LengthHistogram, publish_token_index

__all__ = ["DEFAULT_BATCH_DOCS", "TextPackReport", "pack_tokens"]

DEFAULT_BATCH_DOCS = 1000
TEXT_STATE = f"{STATE_DIR}/text.json"
DOCIDS_HEADER = f"{DOCIDS_DIR}/header.bin"  # written last of docids/ (shardstream.index.keys)
_MERGE_READS = 32
_PROBLEMS_SHOWN = 3


# ------------------------------------------------------------------------------------------ API


@dataclass(frozen=True, kw_only=True)
class TextPackReport:
    """What :func:`pack_tokens` did. Counts are documents and tokens (the end tokens included),
    times seconds.

    Attributes:
        dest: the destination URL.
        index_url: where ``index.bin`` is, or None while other parts are unfinished.
        num_docs, num_tokens, num_shards: what this run packed and published.
        skipped: records this run skipped (each listed in :attr:`problems`).
        problems: the problems this run met (the whole dataset's are in ``dest/pack-report.jsonl``).
        resumed: this run continued an earlier, interrupted one.
        seconds: wall time.
        dataset: the dataset's totals (``num_shards``, ``num_docs``, ``num_tokens``,
            ``skipped``) when this run wrote the index, else None.
        already_complete: ``dest`` already held this very pack, finished.
        kept: with ``overwrite``, what was at ``dest`` and is not the earlier dataset's, kept.
    """

    dest: str
    index_url: str | None
    num_docs: int
    num_tokens: int
    num_shards: int
    skipped: int
    problems: tuple[TextProblem, ...]
    resumed: bool
    seconds: float
    dataset: dict[str, int] | None = None
    already_complete: bool = False
    kept: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: documents, tokens, speed, skipped records, and where the index is."""
        if self.already_complete and self.dataset is not None:
            d = self.dataset
            return (
                f"nothing to do: {self.dest} already holds this pack-text; index {self.index_url}: "
                f"{counted(d['num_shards'], 'shard')}, {counted(d['num_docs'], 'document')}, "
                f"{d['num_tokens']:,} tokens"
            )
        seconds = max(self.seconds, 1e-9)
        line = (
            f"packed {counted(self.num_docs, 'document')} ({self.num_tokens:,} tokens) into "
            f"{counted(self.num_shards, 'shard')} in {self.seconds:.1f} s: {self.num_docs / seconds:,.0f} documents/s, "
            f"{self.num_tokens / seconds:,.0f} tokens/s"
        )
        if self.resumed:
            line += " (resumed)"
        if self.problems:
            kinds: dict[str, int] = {}
            for problem in self.problems:
                kinds[problem.kind] = kinds.get(problem.kind, 0) + 1
            not_text = kinds.pop(NOT_TEXT, 0)
            notes = (
                [f"{self.skipped} skipped ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})"] if kinds else []
            )
            if not_text:
                notes.append(f"{counted(not_text, 'file')} of no text format left out")
            where = f"see {self.dest}/{REPORT_NAME}" if self.dataset is not None else "listed once every part is done"
            line += f"; {', '.join(notes)} ({where})"
        if self.dataset is not None:
            d = self.dataset
            line += (
                f"; index {self.index_url}: {counted(d['num_shards'], 'shard')}, {counted(d['num_docs'], 'document')}, "
                f"{d['num_tokens']:,} tokens"
            )
        else:
            line += "; other parts unfinished, index not written yet"
        if self.kept:
            line += f"; kept what the earlier dataset did not record: {', '.join(self.kept[:10])}"
        return line


def pack_tokens(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    tokenizer: Any,
    text_field: str = "text",
    id_field: str | None = None,
    eod_token: str | None = None,
    eod_id: int | None = None,
    append_eod: bool = True,
    vocab_size: int | None = None,
    batched: bool = False,
    tokenizer_name: str | None = None,
    max_shard_tokens: int = DEFAULT_MAX_SHARD_TOKENS,
    name: str = "tokens",
    workers: int | None = 1,
    part: Part | None = None,
    ray: str | None = None,
    on_error: str | enum.Enum = "skip",
    overwrite: bool = False,
    clobber: bool = False,
    batch_size: int = DEFAULT_BATCH_DOCS,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: bool = True,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
) -> TextPackReport:
    """Tokenize the documents of ``source`` into a token dataset at ``dest`` (module doc).

    Args:
        source: a JSON Lines (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``, ``.json.gz``), Parquet
            or Arrow (``Dataset.save_to_disk``) file, a folder of them (walked recursively, in
            sorted order), or an object-store prefix or file (``s3://``, ``gs://``, ``az://``)
            (:mod:`shardstream.tokens.sources`).
        dest: a local directory (created if needed) or a writable store URL.
        tokenizer: a ``tokenizer.json`` path, a ``tokenizers.Tokenizer``, or a callable: one
            text -> its ids, or with ``batched=True`` a list of texts -> their ids
            (:mod:`shardstream.tokens.tokenize`; for ``workers > 1`` a callable must pickle: a
            module-level function). A Hugging Face tokenizer encodes with truncation and padding
            off, special tokens added as ``encode`` adds them.
        text_field: the JSON field (Parquet / Arrow column) holding each document's text.
        id_field: the field holding its id (a string, or a number kept as text); None: ids
            are ``RELPATH:LINE`` (lines from 1) or ``RELPATH:ROW`` (rows from 0).
        eod_token, eod_id: the end-of-document token appended to every document, by name or
            id; default: the first of ``<|endoftext|>``, ``</s>``, ``<eos>``, ``[EOS]``,
            ``<|end_of_text|>`` in the vocabulary. ``append_eod=False``: none.
        vocab_size: token ids are below it (``uint16`` on disk up to 65,536, else ``uint32``);
            default the tokenizer's ``get_vocab_size()``.
        batched: a callable ``tokenizer`` takes a list of texts.
        tokenizer_name: recorded in ``tokens.bin`` (default: the tokenizer's folder name).
        max_shard_tokens: tokens per shard at most (a longer document gets a shard of its own).
        name: shards are ``NAME-000000.tar``, ...
        workers: processes tokenizing in parallel (1: this process, whose tokenizer keeps its own
            threads; None: the CPU count); each worker process uses one core
            (``TOKENIZERS_PARALLELISM=false`` there: :mod:`shardstream.tokens.tokenize`). With ``ray``:
            Ray tasks (None: the cluster's CPUs). All parts of one pack must use the same number.
            Spawned processes: a script calling this with ``workers > 1`` needs the
            ``if __name__ == "__main__":`` guard.
        part: pack only this part of the streams (``Part(I, N)``); default from the
            environment (``RANK`` / ``WORLD_SIZE``, a job array), else all.
        ray: run the streams as tasks on the Ray cluster at this address (``"auto"``: the one on
            this machine, or ``RAY_ADDRESS``); SOURCE and DEST must be reachable from every node.
        on_error: ``"skip"`` (the default): a record that gives no document (bad JSON, no text,
            no id, a tokenizer error, an unreadable rest of a file) is skipped and listed in
            ``dest/pack-report.jsonl`` with its file and line (or row). ``"raise"`` (or
            ``"fail"``): the first one stops the pack with an error naming its file and line;
            fix it and run again to resume. Empty documents (no token) and files of no text
            format are always skipped and reported, never a reason to stop.
        overwrite: replace what ``dest`` holds: only what its index and pack state record.
        clobber: write over files with the names this pack writes that nothing there records.
        batch_size: documents per tokenizer call.
        chunk_bytes: a local plain JSON Lines file larger than this is cut into runs of lines
            of about this many bytes, which streams share (part of the layout: a resumed or
            parallel pack must use the same).
        progress: a tqdm bar on stderr (tokens/s, documents/s).
        s3, requests, fetch: the store settings of ``s3://`` sources and destinations.

    Returns:
        A :class:`TextPackReport`.

    Raises:
        SourceNotFoundError: nothing at ``source``. SourceError: it holds no text file, no
            document at all, or (``on_error="raise"``) a bad record, named by file and line.
        UnreadableFileError: with ``on_error="raise"``, a file that cannot be read.
        DestinationError: ``dest`` cannot be written, lies inside ``source``, holds a dataset
            or a pack made with other options or of another SOURCE listing (and not
            ``overwrite``), or files with pack-text's names it did not write (and not ``clobber``).
        ValueError: bad options, or a tokenizer that gives ids outside ``0..vocab_size - 1``.
        FileNotFoundError: no ``tokenizer.json`` at the path given.
        ShardstreamError: a worker process died (run again to resume).
        StorageError: a store failed.
    """
    started = time.perf_counter()
    on_error = on_error_of(on_error.value if isinstance(on_error, enum.Enum) else on_error, where="pack_tokens")
    part, workers = part_and_workers(part, workers, ray=ray, overwrite=overwrite)
    for label, value in (
        ("workers", workers),
        ("max_shard_tokens", max_shard_tokens),
        ("batch_size", batch_size),
        ("chunk_bytes", chunk_bytes),
    ):
        if value < 1:
            raise ValueError(f"{label}={value} must be >= 1")
    if not name or "/" in name:
        raise ValueError(f"shard name prefix {name!r} must be a non-empty name without '/'")
    if not text_field or (id_field is not None and not id_field):
        raise ValueError("text_field and id_field must be non-empty field names")
    tok = resolve_tokenizer(
        tokenizer,
        eod_token=eod_token,
        eod_id=eod_id,
        append_eod=append_eod,
        vocab_size=vocab_size,
        batched=batched,
        name=tokenizer_name,
    )
    source_url = source_url_of(source)
    store = open_destination(dest, s3=s3, fetch=fetch, requests=requests)
    check_outside(store, source_url)
    options = TextOptions(
        text_field=text_field,
        id_field=id_field,
        tokenizer=tok.identity,
        tokenizer_info=json.dumps(tok.info, sort_keys=True),
        vocab_size=tok.vocab_size,
        eod_id=tok.eod_id,
        max_shard_tokens=max_shard_tokens,
        chunk_bytes=chunk_bytes,
    )
    spec = PackSpec(
        source=source_url,
        files_from=False,
        name=name,
        max_shard_bytes=max_shard_tokens * token_dtype(tok.vocab_size).itemsize,  # a shard's tokens, in bytes
        max_samples_per_shard=1,  # a token shard is one sample
        num_parts=part.count,
        workers=workers,
        shuffle=False,
        seed=0,
    )
    earlier = _claim_token_files(store, clobber=clobber)
    claim = prepare_state(
        store,
        spec,
        overwrite=overwrite,
        clobber=clobber,
        fix="run the same pack-text command again to finish it, pass --overwrite to replace it",
        what="this pack-text",
    )
    kept = claim.kept
    if overwrite and earlier:
        for stale in earlier:  # the earlier dataset's, which its index does not name
            store.delete(stale)
        store.remove_empty_dirs((DOCIDS_DIR,))
        kept = tuple(top_level_names(store))
    recorded = _recorded_state(store, options)
    if claim.complete and recorded is not None and _tokens_index_ok(store):
        return _nothing_to_do(store, started)
    plan = _ensure_plan(store, source_url, options, recorded, s3=s3, requests=requests)
    for problem in plan.problems:
        _check(problem, on_error)
    dealt = plan.deal(spec.num_streams)
    jobs = [
        TextJob(
            spec=spec,
            options=options,
            stream=stream,
            dest=store.url,
            chunks=tuple(dealt[stream]),
            root=plan.root,
            tokenizer=tok,
            on_error=on_error,
            batch_size=batch_size,
            s3=s3,
            fetch=fetch,
            requests=requests,
        )
        for stream in spec.streams_of_part(part.index)
    ]
    if ray is not None:
        results = _run_on_ray(jobs, progress=progress)
    else:
        results = _run_jobs(jobs, progress=progress)
    dataset = _merge_when_done(store, spec, plan, tok, s3=s3, requests=requests)
    problems = (*plan.problems, *(p for r in results for p in r.problems))
    return TextPackReport(
        dest=store.url,
        index_url=store.url_of(MANIFEST_NAME) if dataset is not None else None,
        num_docs=sum(r.num_docs for r in results),
        num_tokens=sum(r.num_tokens for r in results),
        num_shards=sum(r.num_shards for r in results),
        skipped=sum(1 for p in problems if p.kind != NOT_TEXT),
        problems=problems,
        resumed=any(r.resumed for r in results),
        seconds=time.perf_counter() - started,
        dataset=dataset,
        kept=kept,
    )


# ------------------------------------------------------------------------------------------ state


def _claim_token_files(store: Store, *, clobber: bool) -> list[str]:
    """The names a token dataset has beyond those :mod:`shardstream.packing.ownership` knows
    (``tokens.bin``, ``docids/``) that belong to what is at ``store`` (an index or pack state
    lies beside them: ``overwrite`` deletes them with it). Without one they are another
    writer's: refused unless ``clobber``.

    Raises:
        DestinationError: such names that nothing there records, and not ``clobber``.
    """
    names = [*store.list_names(f"{DOCIDS_DIR}/"), *([TOKENS_INDEX_NAME] if store.exists(TOKENS_INDEX_NAME) else [])]
    if not names:
        return []
    if store.exists(MANIFEST_NAME) or store.exists(SPEC_NAME):
        return names
    if not clobber:
        refuse_foreign(store, names, option="--clobber", what="this pack-text")
    return []


def _recorded_state(store: Store, options: TextOptions) -> dict[str, Any] | None:
    """``text.json`` (options and plan) as recorded, or None; refuses other options.

    Raises:
        DestinationError: it records other options.
        IndexFormatError: it is damaged.
    """
    try:
        data = store.read_bytes(TEXT_STATE)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
        recorded = TextOptions(**doc["options"])
    except (ValueError, TypeError, KeyError) as exc:
        raise IndexFormatError(
            f"{store.url_of(TEXT_STATE)}: damaged pack state ({exc!r}); pack again with --overwrite"
        ) from exc
    if recorded != options:
        raise DestinationError(
            f"{store.url} already holds a pack-text made with other options ({recorded.differences(options)}); "
            "run it with the same options to finish it, pass --overwrite to replace it, or pick another DEST"
        )
    return doc


def _ensure_plan(
    store: Store,
    source_url: str,
    options: TextOptions,
    recorded: dict[str, Any] | None,
    *,
    s3: S3Config | None,
    requests: RequestConfig | None,
) -> Plan:
    """The pack's plan: the one recorded (after checking SOURCE lists the same files), or a
    new one, recorded (another part may have recorded its own meanwhile: the same, or refused)."""
    root, files, problems = list_text_files(source_url, s3=s3, requests=requests)
    listing = [(f.rel, f.fmt, f.size) for f in files]
    if recorded is None:
        plan = make_plan(
            source_url,
            root,
            files,
            problems,
            chunk_bytes=options.chunk_bytes,
            text_field=options.text_field,
            s3=s3,
            requests=requests,
        )
        doc = {"version": 1, "options": asdict(options), "plan": plan.to_json()}
        if store.create_exclusive(TEXT_STATE, json.dumps(doc, sort_keys=True).encode()):
            return plan
        recorded = _recorded_state(store, options)
        assert recorded is not None  # internal: another part wrote it
    plan = Plan.from_json(recorded["plan"])
    if plan.listing() != listing:
        before, now = {f[0] for f in plan.listing()}, {f[0] for f in listing}
        what = (
            f"{len(now - before)} files added, {len(before - now)} gone"
            if before != now
            else "files changed size: " + ", ".join(a[0] for a, b in zip(plan.listing(), listing) if a != b)[:300]
        )
        raise DestinationError(
            f"{store.url_of(TEXT_STATE)}: SOURCE changed since the interrupted pack-text ({what}); restore it, or "
            "pack again with --overwrite"
        )
    return plan


def _tokens_index_ok(store: Store) -> bool:
    """``tokens.bin`` is there and agrees with ``index.bin`` (an ``index merge`` writes no
    tokens.bin), and ``docids/`` is complete (its header is written last)."""
    if not store.exists(DOCIDS_HEADER):
        return False
    try:
        tokens = TokenManifest.parse(store.read_bytes(TOKENS_INDEX_NAME), url=store.url_of(TOKENS_INDEX_NAME))
        manifest = Manifest.parse(store.read_bytes(MANIFEST_NAME), url=store.url_of(MANIFEST_NAME))
    except (FileNotFoundError, IndexFormatError):
        return False
    return tokens.num_shards == manifest.num_shards


def _nothing_to_do(store: Store, started: float) -> TextPackReport:
    tokens = TokenManifest.parse(store.read_bytes(TOKENS_INDEX_NAME), url=store.url_of(TOKENS_INDEX_NAME))
    return TextPackReport(
        dest=store.url,
        index_url=store.url_of(MANIFEST_NAME),
        num_docs=0,
        num_tokens=0,
        num_shards=0,
        skipped=0,
        problems=(),
        resumed=True,
        seconds=time.perf_counter() - started,
        dataset={"num_shards": tokens.num_shards, "num_docs": tokens.num_docs, "num_tokens": tokens.num_tokens},
        already_complete=True,
    )


# ------------------------------------------------------------------------------------------ merge


def _merge_when_done(
    store: Store,
    spec: PackSpec,
    plan: Plan,
    tok: TextTokenizer,
    *,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
) -> dict[str, int] | None:
    """Once every stream of every part is done: the report, ``tokens.bin``, ``index.bin``, the
    document-id index ``docids/`` (:func:`~shardstream.tokens.docids.build_docid_index`) and
    ``merged.json``; the dataset's totals (None while some stream is not done).

    Raises:
        SourceError: no document at all (the pack state is removed: fix SOURCE and run again).
        IndexFormatError: a damaged record.
    """
    streams = recorded_streams(store)
    if any(not streams.get(s, ([], False))[1] for s in range(spec.num_streams)):
        return None
    order = sorted(
        ((seq * spec.num_streams + s, s, seq) for s in range(spec.num_streams) for seq in range(len(streams[s][0]))),
    )
    wanted = [(s, seq) for _, s, seq in order] + [(s, None) for s in range(spec.num_streams)]
    with concurrent.futures.ThreadPoolExecutor(_MERGE_READS, thread_name_prefix="shardstream-merge") as pool:
        docs = list(pool.map(lambda key: _load_record(store, spec, *key), wanted))
    names, rows, problems = [], [], list(plan.problems)
    lengths = LengthHistogram()
    for doc in docs:
        text = doc["text"]
        problems.extend(TextProblem.from_json(p) for p in text["problems"])
        if doc["shard"] is None:
            continue
        row = text["row"]
        rows.append(TokenShardRow(**{**row, "members": tuple(tuple(m) for m in row["members"])}))
        names.append(doc["shard"]["name"])
        lengths.merge(LengthHistogram.from_json(text["lengths"]))
    file_order = {f.url: i for i, f in enumerate(plan.files)}
    problems.sort(
        key=lambda p: (
            file_order.get(p.file, -1),
            p.line if p.line is not None else (p.row if p.row is not None else -1),
        )
    )
    num_docs = sum(r.num_docs for r in rows)
    if num_docs == 0:
        wipe(store, spec)
        store.remove_empty_dirs((STATE_DIR, ""))
        shown = "; ".join(f"{p.where}: {p.reason}" for p in problems[:_PROBLEMS_SHOWN])
        raise SourceError(
            f"{spec.source}: no document to pack"
            + (f" ({counted(len(problems), 'record')} skipped, such as {shown})" if problems else "")
        )
    store.write_bytes(REPORT_NAME, b"".join(json.dumps(p.to_json()).encode() + b"\n" for p in problems))
    tokens = publish_token_index(
        store,
        names,
        rows,
        vocab_size=tok.vocab_size,
        eod_id=tok.eod_id,
        tokenizer=tok.info,
        source=spec.source,
        lengths=lengths,
    )
    build_docid_index(store.url, s3=s3, requests=requests)
    record_merged(store, spec, Manifest.parse(store.read_bytes(MANIFEST_NAME), url=store.url_of(MANIFEST_NAME)))
    return {
        "num_shards": tokens.num_shards,
        "num_docs": tokens.num_docs,
        "num_tokens": tokens.num_tokens,
        "skipped": sum(1 for p in problems if p.kind != NOT_TEXT),
    }
