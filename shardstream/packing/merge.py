"""The end of a pack: ``index.bin`` and ``pack-report.jsonl`` merged from the journal's records
(:mod:`shardstream.packing.journal`) once every stream of every part is done, read many at a
time into compact numeric columns, never a Python object per shard."""

from __future__ import annotations

import array
import collections
import concurrent.futures
import json
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import DestinationError, IndexFormatError
from ..index import MANIFEST_NAME, Manifest, write_with_keys
from ..index.status import MERGED_NAME
from ..storage import Store
from .journal import REPORT_NAME, PackSpec, StreamRecord, recorded_streams
from .sources import Problem

__all__ = [
    "ManifestColumns",
    "load_rows",
    "merge",
    "merged_here",
    "merged_manifest",
    "record_merged",
    "unfinished_streams",
]

MERGE_READS_IN_FLIGHT = 32
log = logging.getLogger("shardstream")


def unfinished_streams(
    store: Store, spec: PackSpec, names: dict[int, tuple[list[int], bool]] | None = None
) -> list[int]:
    """Streams without a done marker (``names``: a listing already made, to reuse). A listed
    pack asks for each stream's marker, many at once, rather than list 10^6 shard records."""
    if names is None and spec.listed:
        streams = range(spec.num_streams)
        with concurrent.futures.ThreadPoolExecutor(
            MERGE_READS_IN_FLIGHT, thread_name_prefix="shardstream-merge"
        ) as pool:
            done = list(pool.map(lambda s: store.exists(StreamRecord.name(s, None)), streams))
        return [s for s, d in zip(streams, done) if not d]
    names = recorded_streams(store) if names is None else names
    return [s for s in range(spec.num_streams) if not names.get(s, ([], False))[1]]


def _load_in_order(
    store: Store, spec: PackSpec, order: Iterator[tuple[int, int | None]], *, max_inflight: int | None = None
) -> Iterator[StreamRecord]:
    """The records ``order`` names, in that order, read ``max_inflight`` (default
    :data:`MERGE_READS_IN_FLIGHT`) at a time (one GET each on an object store: a sequential
    merge of 10^5 records would wait 10^5 round trips)."""
    max_inflight = max_inflight or MERGE_READS_IN_FLIGHT
    ahead: collections.deque[concurrent.futures.Future[StreamRecord]] = collections.deque()
    with concurrent.futures.ThreadPoolExecutor(max_inflight, thread_name_prefix="shardstream-merge") as pool:
        try:
            for stream, seq in order:
                ahead.append(pool.submit(StreamRecord.load, store, stream, seq, spec))
                if len(ahead) >= 2 * max_inflight:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()
        finally:
            for future in ahead:
                future.cancel()


class ManifestColumns:
    """Manifest rows gathered into compact columns (about 40 bytes a shard), never a Python
    object per shard."""

    def __init__(self) -> None:
        self.columns = {k: array.array("q") for k in ("bytes", "num_samples", "num_members", "crc32", "name_offsets")}
        self.columns["name_offsets"].append(0)
        self.blob = bytearray()

    def add(self, row: dict[str, Any] | None, *, url: str) -> None:
        """Append a row (name, bytes, num_samples, num_members, crc32 in hex).

        Raises:
            IndexFormatError: naming ``url``, where the row is damaged.
        """
        columns = self.columns
        try:
            row = row or {}
            values = [int(row[key]) for key in ("bytes", "num_samples", "num_members")]
            crc32 = int(row["crc32"], 16)
            name = str(row["name"]).encode("utf-8")
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{url}: damaged pack record ({exc!r}); pack again with --overwrite") from exc
        for key, value in zip(("bytes", "num_samples", "num_members"), values):
            columns[key].append(value)
        columns["crc32"].append(crc32)
        self.blob += name
        columns["name_offsets"].append(len(self.blob))

    def write(
        self, store: Store, *, classes: list[str] | None = None, class_counts: list[int] | None = None
    ) -> dict[str, int]:
        """Write ``store``'s ``index.bin`` from the rows added (and the dataset's classes, with
        the samples of each); its totals."""
        manifest = self.manifest(store.url_of(MANIFEST_NAME), classes=classes, class_counts=class_counts)
        write_with_keys(store, manifest)
        return manifest.totals()

    def manifest(
        self, url: str, *, classes: list[str] | None = None, class_counts: list[int] | None = None
    ) -> Manifest:
        columns = self.columns
        return Manifest(
            classes=classes,
            class_counts=class_counts,
            url=url,
            shard_bytes=np.frombuffer(columns["bytes"], dtype=np.int64),
            shard_samples=np.frombuffer(columns["num_samples"], dtype=np.int64),
            shard_members=np.frombuffer(columns["num_members"], dtype=np.int64),
            crc32=np.frombuffer(columns["crc32"], dtype=np.int64).astype(np.uint32),
            name_offsets=np.frombuffer(columns["name_offsets"], dtype=np.int64),
            names=np.frombuffer(bytes(self.blob), dtype=np.uint8),
        )


def load_rows(store: Store, spec: PackSpec, stream: int, num_shards: int) -> list[dict[str, Any]]:
    """A listed pack's done-record rows of the first ``num_shards`` shards ``stream`` recorded
    (those of an interrupted run, read many at once)."""
    records = _load_in_order(store, spec, ((stream, seq) for seq in range(num_shards)))
    return [{"shard": r.shard, "problems": [p.to_json() for p in r.problems]} for r in records]


def merge(store: Store, spec: PackSpec) -> tuple[dict[str, int], list[Problem]]:
    """Write ``index.bin`` and ``pack-report.jsonl`` from the records of a finished pack
    (:func:`merged_manifest`), then ``merged.json``, which says the index is the pack's own
    (:mod:`shardstream.index.status`).

    Returns:
        The index totals, and every problem recorded (a listed pack's walk problems first).

    Raises:
        DestinationError: some streams (hence parts) have not finished.
        IndexFormatError: a record is damaged.
    """
    manifest, problems = merged_manifest(store, spec)
    store.write_bytes(REPORT_NAME, b"".join(json.dumps(p.to_json()).encode() + b"\n" for p in problems))
    write_with_keys(store, manifest)
    record_merged(store, spec, manifest)
    return manifest.totals(), problems


def record_merged(store: Store, spec: PackSpec, manifest: Manifest) -> None:
    """Write ``merged.json``: ``manifest`` (the index just written) is the pack ``spec``'s own."""
    store.write_bytes(MERGED_NAME, json.dumps({"spec": spec.digest, "index": manifest.content_digest()}).encode())


def merged_here(store: Store, spec: PackSpec, manifest: Manifest) -> bool:
    """Whether ``merged.json`` says ``manifest`` (the index there) is the pack ``spec``'s own."""
    try:
        doc = json.loads(store.read_bytes(MERGED_NAME))
    except (FileNotFoundError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("spec") == spec.digest and doc.get("index") == manifest.content_digest()


def merged_manifest(store: Store, spec: PackSpec) -> tuple[Manifest, list[Problem]]:
    """The index the records of a finished pack make (not written), and its problems.

    A listed pack's done records hold every row of their stream: one read per stream, many at
    once, in shard order. Other packs' shards are read one record per shard (many at once), by
    global number. Rows go into compact columns (:class:`ManifestColumns`).

    Raises:
        DestinationError: some streams (hence parts) have not finished.
        IndexFormatError: a record is damaged.
    """
    names = None if spec.listed else recorded_streams(store)
    missing = unfinished_streams(store, spec, names)
    if missing:
        parts = sorted({s % spec.num_parts for s in missing})
        raise DestinationError(
            f"{store.url}: cannot write the index yet, parts {parts} of {spec.num_parts} have not "
            "finished; run them (the same command with --part I/N), then `shardstream index merge`"
        )
    problems: list[Problem] = []
    columns = ManifestColumns()
    done_records = _load_in_order(store, spec, ((stream, None) for stream in range(spec.num_streams)))
    if spec.listed:
        from .listing import read_listing_problems

        problems.extend(read_listing_problems(store))
        for done in done_records:
            url = store.url_of(StreamRecord.name(done.stream, None))
            for entry in done.rows or ():
                problems.extend(Problem.from_json(p) for p in entry.get("problems", ()))
                if entry.get("shard") is not None:
                    columns.add(entry["shard"], url=url)
            problems.extend(done.problems)
    else:
        assert names is not None  # listed above
        seqs_of = {s: len(names[s][0]) for s in range(spec.num_streams)}
        order = (
            (stream, seq)
            for seq in range(max(seqs_of.values(), default=0))
            for stream in range(spec.num_streams)
            if seq < seqs_of[stream]
        )
        for record in _load_in_order(store, spec, order):
            problems.extend(record.problems)
            columns.add(record.shard, url=store.url_of(StreamRecord.name(record.stream, record.seq)))
        for done in done_records:
            problems.extend(done.problems)
    classes, class_counts = _classes_packed(store, problems, int(sum(columns.columns["num_samples"])))
    return columns.manifest(store.url_of(MANIFEST_NAME), classes=classes, class_counts=class_counts), problems


def _classes_packed(
    store: Store, problems: list[Problem], num_samples: int
) -> tuple[list[str] | None, list[int] | None]:
    """The classes a labelled pack (or a reshard of a labelled dataset) recorded, with the
    samples of each: those listed, less those a problem left out (:attr:`Problem.cls`).

    Counts that do not add up to the samples packed (a reshard of shards that are not the whole
    dataset the classes came from) are left out of the index, with a warning."""
    from .labels import CLASSES_NAME, read_classes

    recorded = read_classes(store)
    if recorded is None:
        return None, None
    classes, counts = recorded
    if counts is not None:
        counts = list(counts)
        for problem in problems:
            if problem.cls is not None and not problem.packed and 0 <= problem.cls < len(counts):
                counts[problem.cls] -= 1
        if sum(counts) != num_samples:
            log.warning(
                "%s: the per-class counts recorded add up to %d samples, the shards hold %d: the index keeps "
                "the class names without counts",
                store.url_of(CLASSES_NAME),
                sum(counts),
                num_samples,
            )
            counts = None
    return classes, counts
