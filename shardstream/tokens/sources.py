"""What ``pack-text`` reads: documents from JSON Lines (plain, ``.gz``, ``.zst``), Parquet and
Hugging Face ``datasets`` saved to disk (their ``.arrow`` files), as a file, a folder of such
files, or an object-store prefix; and how the input is cut into deterministic *chunks* that
the pack's streams share (:func:`make_plan`).

Files: a folder (local or a prefix: ``s3://``, ``gs://``, ``az://``) is walked recursively in a
fixed order (each folder's files sorted by name, then its subfolders in name order:
:func:`shardstream.packing.sources.ordered_walk`). Formats by name: ``.jsonl``, ``.ndjson``,
and those with ``.gz`` / ``.zst`` / ``.zstd`` after them, and ``.json.gz`` / ``.json.zst``
(JSON Lines, as Dolma names them); ``.parquet``; ``.arrow`` (a ``Dataset.save_to_disk``
folder's data files, Arrow IPC streams; its ``state.json``, ``dataset_info.json`` and
``dataset_dict.json`` are skipped silently). Any other file is skipped and reported
(``not_text``), never a reason to stop.

Chunks: a file is a chunk, except a local JSON Lines file of more than ``chunk_bytes`` of text
(cut into runs of whole lines of about that size, found by one scan that counts its lines; a
compressed run's reader decompresses from the start and skips the lines before it) and a
Parquet file (one chunk per row group). Remote JSON Lines files and Arrow files are a chunk
each (streams share the work file by file).
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import io
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..errors import ShardNotFoundError, SourceError, SourceNotFoundError, StorageError
from ..packing.sources import lister_of, ordered_walk
from ..storage import Store, is_remote_url, loop, open_store

__all__ = [
    "NEVER_STOPS",
    "Chunk",
    "Plan",
    "TextFile",
    "TextProblem",
    "format_of",
    "list_text_files",
    "make_plan",
]

BAD_JSON, NO_TEXT, NO_ID, BAD_ID = "bad_json", "no_text", "no_id", "bad_id"
EMPTY, TOKENIZER_ERROR, UNREADABLE, NOT_TEXT = "empty", "tokenizer_error", "unreadable", "not_text"
NEVER_STOPS = frozenset({EMPTY, NOT_TEXT})  # reported, never a reason to stop under on_error="raise"
HF_METADATA = frozenset({"state.json", "dataset_info.json", "dataset_dict.json"})
DEFAULT_CHUNK_BYTES = 32 << 20
_BLOCK = 4 << 20  # bytes read at a time
_REMOTE_BLOCK = 8 << 20  # bytes of one ranged read of a remote file

_SUFFIXES = (
    (".jsonl", "jsonl"),
    (".ndjson", "jsonl"),
    (".jsonl.gz", "jsonl.gz"),
    (".ndjson.gz", "jsonl.gz"),
    (".json.gz", "jsonl.gz"),
    (".jsonl.zst", "jsonl.zst"),
    (".jsonl.zstd", "jsonl.zst"),
    (".ndjson.zst", "jsonl.zst"),
    (".json.zst", "jsonl.zst"),
    (".json.zstd", "jsonl.zst"),
    (".parquet", "parquet"),
    (".arrow", "arrow"),
)


_KNOWN = ".jsonl, .jsonl.gz, .jsonl.zst, .json.gz, .json.zst, .parquet, .arrow"


def format_of(name: str) -> str | None:
    """``"jsonl"``, ``"jsonl.gz"``, ``"jsonl.zst"``, ``"parquet"``, ``"arrow"`` by a file's name
    (any case), or None for another file."""
    lower = name.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    return None


@dataclass(frozen=True, slots=True)
class TextProblem:
    """A record (or file) that gave no document, and why.

    Attributes:
        file: the file's path or URL.
        kind: ``bad_json``, ``no_text``, ``no_id``, ``bad_id``, ``empty``, ``tokenizer_error``,
            ``unreadable``, ``not_text`` (module doc).
        reason: a phrase naming what is wrong.
        line: its line (from 1), for JSON Lines; row: its row (from 0), for Parquet and Arrow;
            both None for a whole file.
    """

    file: str
    kind: str
    reason: str
    line: int | None = None
    row: int | None = None

    @property
    def packed(self) -> bool:
        return False

    @property
    def count(self) -> int:
        return 1

    @property
    def where(self) -> str:
        """``FILE:LINE`` (``FILE, row N`` for a row, ``FILE`` for a file)."""
        if self.line is not None:
            return f"{self.file}:{self.line}"
        if self.row is not None:
            return f"{self.file}, row {self.row}"
        return self.file

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"file": self.file}
        if self.line is not None:
            doc["line"] = self.line
        if self.row is not None:
            doc["row"] = self.row
        doc.update(kind=self.kind, reason=self.reason)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TextProblem:
        return cls(doc["file"], doc["kind"], doc["reason"], doc.get("line"), doc.get("row"))


@dataclass(frozen=True, slots=True)
class TextFile:
    """A file of the source: ``rel`` (its path relative to SOURCE, ``/``-separated: ids are
    ``rel:LINE``), ``path`` (absolute local path, or its name in the source store), ``url``
    (where messages name it), ``fmt`` (:func:`format_of`) and ``size`` in bytes."""

    rel: str
    path: str
    url: str
    fmt: str
    size: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of one file's documents: the unit a stream takes.

    Attributes:
        index: its place in the plan.
        file: the :class:`TextFile`.
        first: the file's units before it (lines, or rows).
        start, end: its bytes of a plain JSON Lines file (``end`` -1: to the end of the file).
        row_group: its Parquet row group, else -1.
        units: lines or rows in it where known, else -1.
        weight: its size in bytes, about (streams get chunks of about equal total weight).
    """

    index: int
    file: TextFile
    first: int = 0
    start: int = 0
    end: int = -1
    row_group: int = -1
    units: int = -1
    weight: int = 0


@dataclass(frozen=True)
class Plan:
    """The source's files, cut into chunks, and the problems met listing them (walk order);
    ``root``: the store URL remote files' paths are relative to (None: local files)."""

    source: str
    root: str | None
    files: tuple[TextFile, ...]
    chunks: tuple[Chunk, ...]
    problems: tuple[TextProblem, ...]

    def to_json(self) -> dict[str, Any]:
        at = {f.rel: i for i, f in enumerate(self.files)}
        return {
            "source": self.source,
            "root": self.root,
            "files": [[f.rel, f.path, f.url, f.fmt, f.size] for f in self.files],
            "chunks": [[at[c.file.rel], c.first, c.start, c.end, c.row_group, c.units, c.weight] for c in self.chunks],
            "problems": [p.to_json() for p in self.problems],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Plan:
        files = tuple(TextFile(*f) for f in doc["files"])
        chunks = tuple(Chunk(i, files[c[0]], *c[1:]) for i, c in enumerate(doc["chunks"]))
        problems = tuple(TextProblem.from_json(p) for p in doc["problems"])
        return cls(doc["source"], doc["root"], files, chunks, problems)

    def listing(self) -> list[tuple[str, str, int]]:
        """What the plan was made from: each file's relative path, format and size."""
        return [(f.rel, f.fmt, f.size) for f in self.files]

    def deal(self, num_streams: int) -> list[list[Chunk]]:
        """The chunks of each stream, in plan order: each chunk goes to the stream with the
        least weight so far (the lowest-numbered among equals). Depends only on the plan and
        ``num_streams``."""
        streams: list[list[Chunk]] = [[] for _ in range(num_streams)]
        loads = [(0, s) for s in range(num_streams)]  # (weight, stream), kept sorted
        for chunk in self.chunks:
            weight, stream = loads.pop(0)
            streams[stream].append(chunk)
            bisect.insort(loads, (weight + max(chunk.weight, 1), stream))
        return streams


# ------------------------------------------------------------------------------------------ listing


def source_url_of(source: str | os.PathLike[str]) -> str:
    """SOURCE as the pack records it: an absolute local path, or a URL without a trailing ``/``."""
    text = os.fspath(source)
    return text.rstrip("/") if is_remote_url(text) else os.path.abspath(text)


def list_text_files(
    source_url: str, *, s3: Any = None, requests: Any = None
) -> tuple[str | None, list[TextFile], list[TextProblem]]:
    """The text files of SOURCE (module doc) in walk order, and the problems met.

    Returns:
        ``(root, files, problems)``: ``root`` is the URL of the store the files' ``path`` names
        are relative to (None for local files, whose ``path`` is absolute).

    Raises:
        SourceNotFoundError: nothing at SOURCE.
        SourceError: SOURCE is a file of no known format, or holds no text file.
        StorageError: the store failed.
    """
    problems: list[TextProblem] = []
    files: list[TextFile] = []
    store: Any = None
    if is_remote_url(source_url):
        single = _single_remote(source_url, s3=s3, requests=requests)
        if single is not None:
            return single
        store = open_store(source_url, s3=s3, requests=requests)
    elif os.path.isfile(source_url):
        return None, [_single_local(source_url)], []
    elif not os.path.exists(source_url):
        raise SourceNotFoundError(f"{source_url}: no such file or directory (check SOURCE)")
    lister, threads = lister_of(source_url, s3=s3, requests=requests)
    for _, found, _, walk_problems in ordered_walk(lister, threads=threads):
        for problem in walk_problems:
            problems.append(TextProblem(problem.path, UNREADABLE, problem.reason))
        for entry in found:
            base = entry.member_name.rsplit("/", 1)[-1]
            fmt = format_of(base)
            if fmt is None:
                if base not in HF_METADATA:
                    problems.append(
                        TextProblem(entry.path, NOT_TEXT, f"not a text file pack-text reads ({_KNOWN}): skipped")
                    )
                continue
            size = int(entry.size or 0)
            if not _utf8(entry.member_name):  # its documents' ids would not be valid UTF-8
                problems.append(TextProblem(entry.path, UNREADABLE, "file name is not valid UTF-8: skipped; rename it"))
                continue
            if store is not None:  # path: its name in the store
                files.append(TextFile(entry.member_name, entry.member_name, entry.path, fmt, size))
            else:
                files.append(TextFile(entry.member_name, entry.path, entry.path, fmt, size))
    if not files:
        if store is not None and not problems and not store.list_names(""):
            raise SourceNotFoundError(f"{source_url}: nothing there (check SOURCE)")
        skipped = f"; {len(problems)} other files skipped, such as {problems[0].file}" if problems else ""
        raise SourceError(f"{source_url}: holds no text file ({_KNOWN}){skipped}")
    return (source_url if store is not None else None), files, problems


def _single_local(path: str) -> TextFile:
    name = os.path.basename(path)
    fmt = format_of(name)
    if fmt is None:
        raise SourceError(f"{path}: not a text file pack-text reads; give {_KNOWN} files, or a folder of them")
    return TextFile(name, path, path, fmt, os.path.getsize(path))


def _single_remote(
    source_url: str, *, s3: Any, requests: Any
) -> tuple[str | None, list[TextFile], list[TextProblem]] | None:
    """SOURCE as one remote file (a URL ending in a text file's name that names an object), or None."""
    parent, _, name = source_url.rpartition("/")
    if format_of(name) is None or "://" not in parent:
        return None
    store = open_store(parent, s3=s3, requests=requests)
    try:
        size, _ = loop.run(store.head(name))  # type: ignore[attr-defined]
    except (ShardNotFoundError, FileNotFoundError):
        return None
    return parent, [TextFile(name, name, store.url_of(name), format_of(name) or "", int(size))], []


# ------------------------------------------------------------------------------------------ plan


def make_plan(
    source_url: str,
    root: str | None,
    files: list[TextFile],
    problems: list[TextProblem],
    *,
    chunk_bytes: int,
    text_field: str,
    s3: Any = None,
    requests: Any = None,
) -> Plan:
    """Cut ``files`` into chunks (module doc): reads Parquet footers, the schema of Arrow
    files, and scans local JSON Lines files larger than ``chunk_bytes`` (compressed ones: about
    a quarter of it) once. A Parquet
    or Arrow file without a string column ``text_field``, or that cannot be read, is a problem
    (``no_text``, ``unreadable``) and gets no chunk.

    Raises:
        StorageError: the store failed.
    """
    store = open_store(root, s3=s3, requests=requests) if root is not None else None
    chunks: list[Chunk] = []
    problems = list(problems)
    for file in files:
        if (
            file.fmt.startswith("jsonl")
            and store is None
            and file.size * (1 if file.fmt == "jsonl" else 4) > chunk_bytes
        ):
            for run in _line_runs(file, chunk_bytes):
                chunks.append(dataclasses.replace(run, index=len(chunks)))
        elif file.fmt == "parquet":
            groups, problem = _row_groups(file, store, text_field)
            if problem is not None:
                problems.append(problem)
            for first, group, rows, weight in groups:
                chunks.append(Chunk(len(chunks), file, first=first, row_group=group, units=rows, weight=weight))
        elif file.fmt == "arrow":
            problem = _arrow_problem(file, store, text_field)
            if problem is not None:
                problems.append(problem)
            else:
                chunks.append(Chunk(len(chunks), file, weight=file.size))
        else:
            factor = 1 if file.fmt == "jsonl" else 4  # compressed: about 4 times the text
            chunks.append(Chunk(len(chunks), file, weight=file.size * factor))
    return Plan(source_url, root, tuple(files), tuple(chunks), tuple(problems))


def _cuts(f: Any, chunk_bytes: int) -> list[tuple[int, int]]:
    """``(byte, lines before it)`` where each run of whole lines of about ``chunk_bytes`` starts
    in binary stream ``f`` (the first ``(0, 0)``; a run ends after the first line break at or
    past its start + ``chunk_bytes``). A stream that cannot be read to its end (a damaged
    compressed file) is cut up to where it breaks off: its last run's reader reports the rest."""
    cuts = [(0, 0)]
    target, offset, lines = chunk_bytes, 0, 0
    read = getattr(f, "read1", f.read)
    try:
        while block := read(_BLOCK):
            while target < offset + len(block):
                at = block.find(b"\n", max(0, target - offset))
                if at < 0:
                    break
                cut = offset + at + 1
                cuts.append((cut, lines + block.count(b"\n", 0, at + 1)))
                target = cut + chunk_bytes
            lines += block.count(b"\n")
            offset += len(block)
    except Exception as exc:
        if not _read_error(exc):
            raise
    while len(cuts) > 1 and cuts[-1][0] >= offset:  # a cut at the very end starts no run
        cuts.pop()
    return cuts


def _read_error(exc: BaseException) -> bool:
    """Whether ``exc`` says a file is damaged or cut short (gzip, zlib, zstd, a short read)."""
    if isinstance(exc, StorageError):
        return False
    return isinstance(exc, OSError | EOFError | zlib.error | ValueError) or type(exc).__name__ == "ZstdError"


def _line_runs(file: TextFile, chunk_bytes: int) -> list[Chunk]:
    """The runs of lines of a local JSON Lines file (module doc), as chunks (index 0): of a plain
    file with their byte ranges; of a compressed one by line numbers alone (its reader
    decompresses from the start and skips the lines before its run, ~100 times faster than
    tokenizing them)."""
    with open(file.path, "rb") as raw:
        plain = file.fmt == "jsonl"
        cuts = _cuts(raw if plain else _decompressed(file.fmt, raw), chunk_bytes)
    runs = []
    for i, (byte, line) in enumerate(cuts):
        last = i + 1 == len(cuts)
        end, units = (-1, -1) if last else (cuts[i + 1][0], cuts[i + 1][1] - line)
        weight = (file.size if plain else 4 * file.size) - byte if last else end - byte
        if plain:
            runs.append(Chunk(0, file, first=line, start=byte, end=end, units=units, weight=max(weight, 1)))
        else:
            runs.append(Chunk(0, file, first=line, units=units, weight=max(weight, 1)))
    return runs


def _row_groups(
    file: TextFile, store: Store | None, text_field: str
) -> tuple[list[tuple[int, int, int, int]], TextProblem | None]:
    """``(first row, row group, rows, weight)`` of each row group of a Parquet file, or a problem."""
    import pyarrow.parquet as pq

    try:
        with open_binary(file, store) as f:
            parquet = pq.ParquetFile(f)
            meta = parquet.metadata
            problem = _schema_problem(file, parquet.schema_arrow, text_field)
            if problem is not None:
                return [], problem
            groups, first = [], 0
            for group in range(meta.num_row_groups):
                info = meta.row_group(group)
                groups.append((first, group, info.num_rows, max(info.total_byte_size, 1)))
                first += info.num_rows
            return groups, None
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file are many: reported
        return [], TextProblem(file.url, UNREADABLE, f"cannot read as Parquet: {exc}")


def _arrow_problem(file: TextFile, store: Store | None, text_field: str) -> TextProblem | None:
    try:
        with open_binary(file, store) as f:
            reader = _arrow_reader(f)
            return _schema_problem(file, reader.schema, text_field)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file are many: reported
        return TextProblem(file.url, UNREADABLE, f"cannot read as an Arrow stream or file: {exc}")


def _schema_problem(file: TextFile, schema: Any, text_field: str) -> TextProblem | None:
    import pyarrow as pa

    index = schema.get_field_index(text_field)
    if index < 0:
        names = ", ".join(schema.names[:10])
        return TextProblem(file.url, NO_TEXT, f"no column {text_field!r} (columns: {names}); give --text-field")
    kind = schema.field(index).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        return TextProblem(file.url, NO_TEXT, f"column {text_field!r} holds {kind}, not strings")
    return None


def _arrow_reader(f: Any) -> Any:
    """An Arrow IPC stream reader (what ``save_to_disk`` writes), or a file reader."""
    import pyarrow as pa

    try:
        return pa.ipc.open_stream(f)
    except pa.ArrowInvalid:
        f.seek(0)
        file_reader = pa.ipc.open_file(f)
        return _FileBatches(file_reader)


class _FileBatches:
    """An Arrow IPC *file* reader seen as a stream of batches."""

    def __init__(self, reader: Any) -> None:
        self.reader, self.schema = reader, reader.schema

    def __iter__(self) -> Iterator[Any]:
        return (self.reader.get_batch(i) for i in range(self.reader.num_record_batches))


# ------------------------------------------------------------------------------------------ reading


class RangedFile(io.RawIOBase):
    """A remote object as a seekable binary file: each read one ranged GET (wrap it in an
    ``io.BufferedReader`` for reads of :data:`_REMOTE_BLOCK` bytes)."""

    def __init__(self, store: Any, name: str, size: int) -> None:
        super().__init__()
        self.store, self.name, self.size, self.pos = store, name, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        end = min(self.size, self.pos + len(buffer))
        if end <= self.pos:
            return 0
        future = loop.submit(self.store.get_range(self.name, self.pos, end))
        pieces, _, _ = loop.result_within(future, self.store, self.store.url_of(self.name))
        data = b"".join(pieces)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def open_binary(file: TextFile, store: Any) -> BinaryIO:
    """``file`` opened for reading (a local file, or a remote one through ranged reads).

    Raises:
        FileNotFoundError, OSError: a local file; StorageError: the store failed.
    """
    if store is None:
        return open(file.path, "rb")
    return io.BufferedReader(RangedFile(store, file.path, file.size), buffer_size=_REMOTE_BLOCK)  # type: ignore[return-value]


def _decompressed(fmt: str, raw: Any) -> Any:
    if fmt == "jsonl.gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if fmt == "jsonl.zst":
        try:
            import zstandard
        except ImportError:
            from ..errors import MissingDependencyError

            raise MissingDependencyError(
                "reading .zst files needs zstandard: pip install 'shardstream[text]'"
            ) from None
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
