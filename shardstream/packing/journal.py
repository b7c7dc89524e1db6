"""The pack journal: what makes `pack` resumable, parallel and splittable across machines.

A pack divides its input into ``num_streams = num_parts * workers`` *streams*: sample number
``k`` of the source (in its deterministic order) belongs to stream ``k % num_streams``;
stream ``s`` belongs to part ``s % num_parts`` and is written by one worker process. Stream
``s`` writes shards ``seq = 0, 1, ...`` named by the global number ``seq * num_streams + s``,
so names never clash and one stream writes what it wrote before.

State lives in ``DEST/.shardstream/``:

- ``pack.json``: the :class:`PackSpec`; a resumed or parallel part must use the same one;
- ``sSSSSS-QQQQQQQ.json``: written right after shard ``QQQQQQQ`` of stream ``SSSSS`` and its
  sample table are published: its manifest row (name, bytes, sample and member counts,
  CRC-32), how many source samples the stream had consumed by then, and the problems met
  among those samples;
- ``sSSSSS-done.json``: the stream finished, with its remaining problems.

A killed stream resumes after its last record: it skips the samples it had consumed (without
reading them) and writes the next shard number; the shard that was in progress is written
again, so no work beyond it is redone. When every stream is done, :func:`.merge.merge` writes the
manifest ``index.bin`` (and ``pack-report.jsonl`` listing each problem), reading one record at
a time into numeric columns. The records stay, so ``shardstream index merge`` can be run
again; ``--overwrite`` clears them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import DestinationError, IndexFormatError
from ..index import TABLE_SUFFIX
from ..index.status import RECORD_NAME, SPEC_NAME, STATE_DIR
from ..storage import Store
from .sources import Problem
from .writer import AbortsOnError, PublishedShard, RotatingTarWriter, ShardLimits

__all__ = [
    "JournaledWriter",
    "PackSpec",
    "StreamRecord",
    "StreamState",
    "read_stream_state",
    "remove_stream_partials",
]

REPORT_NAME = "pack-report.jsonl"


@dataclass(frozen=True, kw_only=True)
class PackSpec:
    """Everything that decides which samples go into which shard. Sizes are bytes."""

    source: str
    files_from: bool
    name: str
    max_shard_bytes: int
    max_samples_per_shard: int | None
    num_parts: int
    workers: int
    shuffle: bool
    seed: int
    from_shards: bool = False  # SOURCE is tar shards whose samples are packed again (resharding)
    listed: bool = False  # the source is listed once and planned into shards (packing.listing)
    labels_from_dirs: bool = False  # each file a sample, labelled by its class folder (packing.labels)
    check_images: bool = False  # every image member decoded while packing; one that fails is a problem
    labels_from: str | None = None  # a labels file (packing.label_file): each file a sample, labelled by its row
    classes: tuple[str, ...] | None = None  # the class list pinned by --classes / --classes-from

    @property
    def num_streams(self) -> int:
        return self.num_parts * self.workers

    @property
    def limits(self) -> ShardLimits:
        """Where its shards end (for a listed pack, where its listing plans them to)."""
        return ShardLimits(self.max_shard_bytes, self.max_samples_per_shard)

    def streams_of_part(self, part: int) -> list[int]:
        return list(range(part, self.num_streams, self.num_parts))

    def shard_name(self, stream: int, seq: int) -> str:
        """Shard ``seq`` of ``stream``; for a listed pack, ``stream`` is the first shard of the
        stream's range and the name is the planned shard's number."""
        return f"{self.name}-{self.shard_number(stream, seq):06d}.tar"

    def shard_number(self, stream: int, seq: int) -> int:
        return stream + seq if self.listed else seq * self.num_streams + stream

    def shard_of_name(self, name: str) -> int | None:
        """The number of shard ``name`` (or of its sample table), or None if it is not one of
        this pack's."""
        match = re.fullmatch(re.escape(self.name) + r"-(\d{6,})\.tar(?:" + re.escape(TABLE_SUFFIX) + ")?", name)
        return int(match.group(1)) if match else None

    def stream_of_shard(self, name: str) -> int | None:
        """The stream that writes shard ``name`` (or its sample table), or None if it is not
        one of this pack's. Not for a listed pack, whose streams own ranges of its listing."""
        assert not self.listed, "a listed pack's streams own ranges: see Listing.shard_range"
        number = self.shard_of_name(name)
        return None if number is None else number % self.num_streams

    @classmethod
    def of_code(
        cls, source: str, *, name: str, max_shard_bytes: int, max_samples_per_shard: int | None, num_parts: int
    ) -> PackSpec:
        """The spec of samples written from code (``ShardWriter``, ``pack_samples``): one
        stream per part, so the shards do not depend on how many processes make the samples."""
        return cls(
            source=source,
            files_from=False,
            name=name,
            max_shard_bytes=max_shard_bytes,
            max_samples_per_shard=max_samples_per_shard,
            num_parts=num_parts,
            workers=1,
            shuffle=False,
            seed=0,
        )

    def to_json(self) -> bytes:
        doc = asdict(self)
        # flags as before they existed: earlier unfinished packs still resume
        for flag in (
            "from_shards",
            "listed",
            "labels_from_dirs",
            "check_images",
            "labels_from",
            "classes",
        ):
            if doc[flag] is None or doc[flag] is False:
                del doc[flag]
        return json.dumps({"version": 1, **doc}, sort_keys=True).encode()

    @property
    def digest(self) -> str:
        """Identifies these options in every record written under them."""
        return hashlib.sha1(self.to_json()).hexdigest()[:16]

    def differences(self, other: PackSpec) -> str:
        """``"workers: 2 recorded, 4 given; ..."`` for the fields that differ."""
        return "; ".join(
            f"{k}: {getattr(self, k)!r} recorded, {getattr(other, k)!r} given"
            for k in asdict(self)
            if getattr(self, k) != getattr(other, k)
        )

    @classmethod
    def from_json(cls, data: bytes, *, url: str) -> PackSpec:
        try:
            doc = json.loads(data)
            doc.pop("version")
            if doc.get("classes") is not None:
                doc["classes"] = tuple(doc["classes"])
            return cls(**doc)
        except (ValueError, TypeError, KeyError) as exc:
            raise IndexFormatError(f"{url}: unreadable pack state ({exc!r}); pack again with --overwrite") from exc


@dataclass(frozen=True, kw_only=True)
class StreamRecord:
    """What a stream recorded after publishing one shard (or, with ``shard=None``, when done).

    Stored as one JSON line; ``shard`` is the shard's manifest row.
    """

    stream: int
    seq: int
    consumed: int
    problems: tuple[Problem, ...]
    spec_digest: str
    last_key: str | None = None  # key of the last source sample consumed, checked on resume
    shard: dict[str, Any] | None = None  # name, bytes, num_samples, num_members, crc32
    within: int = 0  # pack_samples: samples of input ``consumed`` already written (its fn gave several)
    # a listed pack's done record: every shard of the stream in order, {"shard": row or None,
    # "problems": [...]}, so the merge reads one record per stream
    rows: tuple[dict[str, Any], ...] | None = None

    def header(self) -> bytes:
        doc: dict[str, Any] = {
            "stream": self.stream,
            "seq": self.seq,
            "consumed": self.consumed,
            "last_key": self.last_key,
            "spec": self.spec_digest,
            "problems": [p.to_json() for p in self.problems],
            "shard": self.shard,
        }
        if self.within:  # only pack_samples writes it; pack's records stay as they were
            doc["within"] = self.within
        if self.rows is not None:
            doc["rows"] = list(self.rows)
        return json.dumps(doc).encode() + b"\n"  # ASCII: problem paths may hold undecodable bytes

    @classmethod
    def load(cls, store: Store, stream: int, seq: int | None, spec: PackSpec) -> StreamRecord:
        """Read a record.

        Raises:
            IndexFormatError: the record is damaged, or was written by a pack with other
                settings (two parts started with different options).
        """
        url = store.url_of(cls.name(stream, seq))
        try:
            doc = json.loads(store.read_bytes(cls.name(stream, seq)).partition(b"\n")[0])
            record = cls(
                stream=doc["stream"],
                seq=doc["seq"],
                consumed=doc["consumed"],
                shard=doc["shard"],
                last_key=doc["last_key"],
                spec_digest=doc["spec"],
                problems=tuple(Problem.from_json(p) for p in doc["problems"]),
                within=int(doc.get("within", 0)),
                rows=None if doc.get("rows") is None else tuple(doc["rows"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise IndexFormatError(f"{url}: damaged pack record ({exc}); pack again with --overwrite") from exc
        if record.spec_digest != spec.digest:
            raise IndexFormatError(
                f"{url}: written by a pack with other options than {store.url_of(SPEC_NAME)} (parts "
                "started with different options?); pack again with --overwrite and the same options for every part"
            )
        return record

    @staticmethod
    def name(stream: int, seq: int | None) -> str:
        """Record name; ``seq=None`` names the stream's done marker."""
        return f"{STATE_DIR}/s{stream:05d}-{'done' if seq is None else f'{seq:07d}'}.json"

    def save(self, store: Store, *, done: bool = False) -> None:
        """Write it under its name (``done``: as the stream's done marker)."""
        store.write_bytes(StreamRecord.name(self.stream, None if done else self.seq), self.header())


def remove_stream_partials(store: Store, spec: PackSpec, stream: int, shards: range | None = None) -> None:
    """Drop what a killed writer of ``stream`` left behind: its partial shard, table and
    records (``shards``: a listed pack's range of the stream)."""
    own_records = f"{STATE_DIR}/s{stream:05d}-"

    def mine(name: str) -> bool:
        if name.startswith(own_records):
            return True
        if shards is None:
            return spec.stream_of_shard(name) == stream
        return spec.shard_of_name(name) in shards

    store.remove_partials(mine, folders=("", STATE_DIR))


class JournaledWriter(AbortsOnError):
    """One stream's shards, each recorded right after it is published (with where the stream
    stood in its input, so a rerun resumes after it): what ``pack``, ``pack_samples`` and
    :class:`shardstream.ShardWriter` all write through.

    The position moves as samples are written and inputs done: :attr:`consumed` (inputs
    done), :attr:`within` (samples of the next input already written) and :attr:`last_key`. A
    shard published before a sample records the position as it was after the previous one.
    :attr:`pending` problems go into the next record. As a context manager, it drops the shard
    in progress when the block raises.
    """

    def __init__(
        self, store: Store, spec: PackSpec, stream: int, state: StreamState, *, first_shard: int | None = None
    ) -> None:
        self.store, self.spec, self.stream = store, spec, stream
        self.consumed, self.within, self.last_key = state.consumed, state.within, state.last_key
        self.pending: list[Problem] = []
        self.num_shards = 0  # published by this run
        self.rows: list[dict[str, Any]] | None = None if first_shard is None else []  # a listed pack's, this run
        self.writer = RotatingTarWriter(
            store,
            shard_names=lambda seq: spec.shard_name(stream if first_shard is None else first_shard, seq),
            limits=spec.limits if first_shard is None else None,  # a listed pack's shards end by end_shard
            first_seq=state.num_shards,
            on_commit=self._on_commit,
        )

    def _record(self, seq: int, problems: tuple[Problem, ...] = (), **fields: Any) -> StreamRecord:
        """A record of where the stream stands, with the problems pending (and ``problems``)."""
        return StreamRecord(
            stream=self.stream,
            seq=seq,
            consumed=self.consumed,
            last_key=self.last_key,
            spec_digest=self.spec.digest,
            problems=(*self.pending, *problems),
            within=self.within,
            **fields,
        )

    def _on_commit(self, published: PublishedShard) -> None:
        record = self._record(self.writer.seq - 1, shard=published.row)
        record.save(self.store)
        self._recorded(record)
        self.num_shards += 1

    def _recorded(self, record: StreamRecord) -> None:
        if self.rows is not None:
            self.rows.append({"shard": record.shard, "problems": [p.to_json() for p in record.problems]})
        self.pending.clear()

    def end_shard(self) -> None:
        """A listed pack's planned shard is complete: publish and record it, or, when every
        input of it was skipped, record that it is empty (so shard numbers stay the plan's)."""
        if self.writer.in_progress:
            self.writer.close()
            return
        record = self._record(self.writer.seq)
        record.save(self.store)
        self.writer.skip()
        self._recorded(record)

    def write_sample(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Append a sample of the input in progress (members sorted by name); may first
        publish and record a shard."""
        self.writer.write_sample(key, members)
        self.within += 1
        self.last_key = key

    def input_done(self, last_key: str | None = None) -> None:
        """The input in progress is done (``last_key``: its key, for pack's inputs that gave
        no member)."""
        self.consumed += 1
        self.within = 0
        if last_key is not None:
            self.last_key = last_key

    def finish(self, problems: tuple[Problem, ...] = (), *, earlier_rows: list[dict[str, Any]] | None = None) -> None:
        """Publish the shard in progress, then the stream's done record (with ``pending``
        and ``problems``; a listed pack's with every shard's row, ``earlier_rows`` being
        those of the runs before this one)."""
        self.writer.close()
        rows = None if self.rows is None else (*(earlier_rows or ()), *self.rows)
        self._record(self.writer.seq, problems, rows=rows).save(self.store, done=True)
        self.pending.clear()

    def abort(self) -> None:
        """Drop the shard in progress; what was published and recorded stays."""
        self.writer.abort()


@dataclass(frozen=True)
class StreamState:
    """Where a stream stands: shards published, samples consumed, and whether it is done."""

    num_shards: int
    consumed: int
    last_key: str | None
    done: StreamRecord | None
    within: int = 0


def recorded_streams(store: Store, prefix: str = f"{STATE_DIR}/s") -> dict[int, tuple[list[int], bool]]:
    """Per stream: the sequence numbers recorded and whether it is done."""
    streams: dict[int, tuple[list[int], bool]] = {}
    for name in store.list_names(prefix):
        match = RECORD_NAME.match(name)
        if match:
            seqs, done = streams.get(int(match.group(1)), ([], False))
            if match.group(2) == "done":
                done = True
            else:
                seqs.append(int(match.group(2)))
            streams[int(match.group(1))] = (seqs, done)
    return streams


def read_stream_state(store: Store, spec: PackSpec, stream: int) -> StreamState:
    """Read where ``stream`` stopped (reads only its last record).

    Raises:
        DestinationError: its records have a gap (the state was edited or damaged).
    """
    seqs, done = recorded_streams(store, f"{STATE_DIR}/s{stream:05d}-").get(stream, ([], False))
    if seqs != list(range(len(seqs))):
        raise DestinationError(f"{store.url}: pack records of stream {stream} have gaps; pack again with --overwrite")
    if done:
        record = StreamRecord.load(store, stream, None, spec)
        return StreamState(len(seqs), record.consumed, record.last_key, record, record.within)
    if not seqs:
        return StreamState(0, 0, None, None)
    last = StreamRecord.load(store, stream, seqs[-1], spec)
    return StreamState(len(seqs), last.consumed, last.last_key, None, last.within)
