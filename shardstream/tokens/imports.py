"""Token datasets from other tools' files: Megatron-LM's ``PREFIX.bin``/``PREFIX.idx`` pairs
(:func:`import_megatron`) and datatrove's tokenized ``.ds`` files (:func:`import_datatrove`).

Both read their inputs themselves (numpy, the formats below): neither megatron-core nor
datatrove is needed. The tokens are read through ``np.memmap`` and written shard by shard:
memory is one shard's tokens (``max_shard_tokens``) and a window of document boundaries, never
O(tokens). Documents are copied token for token with their boundaries (an empty one, which
a token shard cannot hold, is skipped and counted); nothing is appended (``eod_id`` is
recorded, and the report counts the documents that end with it). Ids are ``NAME:N``: ``NAME``
the input's file name (the Megatron prefix's last part, the ``.ds`` file's name without
``.ds``), ``N`` the document's number in it. ``DEST/docids/`` is built at the end
(:func:`~.docids.build_docid_index`).

The Megatron ``.idx`` format and its checks are in :mod:`.megatron`.

datatrove (``datatrove.pipeline.tokens.tokenizer.TokenizedFile``): ``NAME.ds`` the tokens back
to back (``uint16``, or ``uint32`` for a vocabulary over 65,536), ``NAME.ds.index`` each
document's end (exclusive, in tokens) as ``uint64``, ``NAME.ds.metadata`` text: the tokenizer
name ``|`` the token size in bytes, the token count, the count in words. ``NAME.ds.loss`` (loss
masks) is not imported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..config import RequestConfig, S3Config
from ..errors import DestinationError, SourceError, SourceNotFoundError
from ..storage import Store, open_store
from .docids import build_docid_index
from .format import token_dtype
from .megatron import megatron_prefixes, memmap_tokens, need_file, open_megatron
from .writer import DEFAULT_MAX_SHARD_TOKENS, LengthHistogram, publish_token_index, write_token_shard

__all__ = ["ImportReport", "import_datatrove", "import_megatron"]

VOCAB_MULTIPLE = 128  # a vocabulary not given is the largest id + 1 rounded up to this (as Megatron pads it)
_CHUNK = 1 << 22  # index entries checked at a time (32 MB of int64)
_DOC_WINDOW = 1 << 20  # document boundaries held at a time
_SCAN = 1 << 24  # tokens scanned at a time for the largest id


@dataclasses.dataclass(frozen=True)
class ImportReport:
    """What an import wrote.

    Attributes:
        dest: the dataset's URL; sources: the files read (the ``.bin`` or ``.ds`` of each).
        num_shards, num_docs, num_tokens: what the dataset holds.
        dtype: ``"uint16"`` or ``"uint32"``; vocab_size, eod_id: as recorded in ``tokens.bin``.
        empty_docs: documents of no token, skipped (their numbers are not in the ids).
        docs_ending_with_eod: documents whose last token is ``eod_id`` (None without one).
        seconds: wall time, the document-id index included.
    """

    dest: str
    sources: tuple[str, ...]
    num_shards: int
    num_docs: int
    num_tokens: int
    dtype: str
    vocab_size: int
    eod_id: int | None
    empty_docs: int
    docs_ending_with_eod: int | None
    seconds: float

    def summary(self, what: str) -> str:
        """One line: ``imported 2 Megatron files into DEST: 3 shards, ...``."""
        files = f"{len(self.sources)} {what} file{'s' if len(self.sources) != 1 else ''}"
        line = (
            f"imported {files} into {self.dest}: {self.num_shards} shards, {self.num_docs:,} documents, "
            f"{self.num_tokens:,} tokens ({self.dtype}, vocab_size {self.vocab_size}"
        )
        if self.eod_id is not None:
            line += f", eod id {self.eod_id}: {self.docs_ending_with_eod:,} documents end with it"
        line += "); document-id index in docids/"
        if self.empty_docs:
            line += f"; {self.empty_docs:,} empty documents skipped"
        return line


@dataclasses.dataclass
class _Source:
    """One input: its tokens (memory-mapped) and its documents' boundaries, read a window at a time."""

    path: str  # the file errors name (the .bin or .ds)
    name: str  # the ids' prefix
    tokens: np.ndarray  # 1-D, the input's dtype
    num_docs: int
    doc_ends: Callable[[int, int], np.ndarray]  # int64 token ends (exclusive) of documents [d0, d1)
    tokenizer: str | None = None


# Megatron


def import_megatron(
    prefixes: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    *,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    max_shard_tokens: int = DEFAULT_MAX_SHARD_TOKENS,
    tokenizer: str | dict[str, Any] | None = None,
    name: str = "tokens",
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> ImportReport:
    """Import Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``, as
    ``tools/preprocess_data.py`` writes them) into a new token dataset at ``dest``.

    A shardstream document is a Megatron **document** (``document_indices``), not a sequence:
    the sequences of one document (sentences, with ``--split-sentences``) are joined, as a
    model trained on documents wants them; each document's boundaries are kept exactly. Ids
    are ``PREFIXNAME:N``, ``N`` Megatron's document number (the prefix's last path part).
    The inputs are read with numpy alone (module doc); megatron-core is not needed.

    Args:
        prefixes: one or more datasets: ``PREFIX``, ``PREFIX.bin`` or ``PREFIX.idx``, or a
            directory (every ``.idx`` in it, in name order), local; their documents follow each
            other in this order.
        dest: a local directory or remote prefix (``s3://`` ...) that holds nothing yet.
        vocab_size: ids are below it (checked); decides ``uint16`` (up to 65,536) or ``uint32``
            on disk. Default: the largest id (or ``eod_id``) + 1, rounded up to a multiple of 128
            (an ``int32`` input is read once more to find it).
        eod_id: the end-of-document token to record (Megatron's ``--append-eod`` put it in the
            documents already; nothing is appended).
        max_shard_tokens: a shard closes before this many tokens (a longer document makes a shard
            of its own).
        tokenizer: recorded in ``tokens.bin``: a name or a ``tokenizer.json`` path (its sha256
            recorded), or the dict itself.
        name: shards are ``NAME-000000.tar`` ...
        s3, requests: how ``dest`` is reached.
        on_tokens: called with the tokens of each shard written (a progress bar).

    Returns:
        An :class:`ImportReport`.

    Raises:
        SourceNotFoundError: a ``.bin`` or its ``.idx`` is missing (named).
        SourceError: an ``.idx`` is damaged or disagrees with its ``.bin`` (truncated, longer)
            or has sequences after its last document end (which megatron-core refuses too),
            a token id is negative or not below ``vocab_size``, a multimodal dataset, or two
            prefixes of one name (ids would repeat).
        DestinationError: ``dest`` holds files already.
    """
    given = _given(prefixes, "import_megatron needs at least one PREFIX (PREFIX.bin and PREFIX.idx)")
    return _import(
        "megatron",
        [_megatron_source(p) for p in megatron_prefixes(given)],
        dest,
        vocab_size=vocab_size,
        eod_id=eod_id,
        max_shard_tokens=max_shard_tokens,
        tokenizer=tokenizer,
        name=name,
        s3=s3,
        requests=requests,
        on_tokens=on_tokens,
    )


def _megatron_source(prefix: str) -> _Source:
    pair = open_megatron(prefix)
    return _Source(
        path=pair.bin_path, name=pair.name, tokens=pair.tokens, num_docs=pair.num_docs, doc_ends=pair.doc_ends
    )


# datatrove


def _datatrove_metadata(path: str) -> tuple[str | None, int | None]:
    """``(tokenizer name, token size)`` from ``PATH.metadata``, or Nones when there is none."""
    meta = path + ".metadata"
    if not os.path.isfile(meta):
        return None, None
    with open(meta, encoding="utf-8", errors="replace") as f:
        first = f.readline().strip()
    name, sep, size = first.rpartition("|")
    if not sep or not size.isdigit() or int(size) not in (2, 4):
        raise SourceError(
            f"{meta}: first line {first!r} is not 'TOKENIZER|2' or 'TOKENIZER|4' (datatrove's token size); "
            "fix or remove it (the token size is then read from the file sizes)"
        )
    name = name.removesuffix("|2").removesuffix("|4")  # "Unknown Tokenizer|2|2"
    return (None if name.startswith("Unknown Tokenizer") else name), int(size)


def _open_datatrove(given: str | os.PathLike[str]) -> _Source:
    path = os.fspath(given)
    for suffix in (".index", ".metadata", ".loss"):
        if path.endswith(".ds" + suffix):
            path = path[: -len(suffix)]
    need_file(path, "a datatrove tokenized file", "pass the .ds files datatrove's DocumentTokenizer wrote")
    index_path = path + ".index"
    need_file(
        index_path,
        f"the document ends of {path}",
        "without it the document boundaries are not stored (datatrove's save_index=False): re-run the "
        "tokenizer with save_index=True, or copy the .ds.index written with it",
    )
    redo = "re-copy the .ds with its .ds.index, or re-run datatrove's tokenizer"
    tokenizer, size = _datatrove_metadata(path)
    ds_size, index_size = os.path.getsize(path), os.path.getsize(index_path)
    if index_size % 8:
        raise SourceError(f"{index_path}: {index_size} bytes, not whole uint64 document ends: truncated; {redo}")
    ends = np.memmap(index_path, dtype="<u8", mode="r") if index_size else np.zeros(0, dtype="<u8")
    num_tokens = int(ends[-1]) if len(ends) else 0
    if size is None:  # no metadata: what the sizes say, else datatrove's default
        size = 4 if num_tokens and ds_size == 4 * num_tokens else 2
    if ds_size != num_tokens * size:
        how = "truncated" if ds_size < num_tokens * size else "longer than its index says"
        raise SourceError(
            f"{path}: {ds_size} bytes, where {index_path} makes {num_tokens} tokens of {size} bytes "
            f"({num_tokens * size} bytes): {how}; {redo}"
        )
    last = 0
    for a in range(0, len(ends), _CHUNK):
        chunk = ends[a : a + _CHUNK]
        if int(chunk[0]) < last or (np.diff(chunk.astype(np.int64)) < 0).any():
            raise SourceError(f"{index_path}: document ends go back near document {a}: damaged; {redo}")
        last = int(chunk[-1])
    dtype = np.dtype("<u2" if size == 2 else "<u4")

    def doc_ends(d0: int, d1: int) -> np.ndarray:
        return np.asarray(ends[d0:d1], dtype=np.int64)

    name = os.path.basename(path)
    return _Source(
        path=path,
        name=name[: -len(".ds")] if name.endswith(".ds") else name,
        tokens=memmap_tokens(path, dtype, num_tokens),
        num_docs=len(ends),
        doc_ends=doc_ends,
        tokenizer=tokenizer,
    )


def _datatrove_files(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    out = []
    for p in paths:
        text = os.fspath(p)
        if os.path.isdir(text):
            found = sorted(os.path.join(text, n) for n in os.listdir(text) if n.endswith(".ds"))
            if not found:
                raise SourceNotFoundError(f"{text}: holds no .ds file; pass datatrove's tokenized .ds files")
            out += found
        else:
            out.append(text)
    return out


def import_datatrove(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    *,
    vocab_size: int | None = None,
    eod_id: int | None = None,
    max_shard_tokens: int = DEFAULT_MAX_SHARD_TOKENS,
    tokenizer: str | dict[str, Any] | None = None,
    name: str = "tokens",
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> ImportReport:
    """Import datatrove's tokenized files (``NAME.ds`` with ``NAME.ds.index``, and
    ``NAME.ds.metadata`` when written: module doc) into a new token dataset at ``dest``.

    A document is one ``.ds.index`` entry, kept exactly; its id is ``NAME:N`` (``NAME`` the
    file name without ``.ds``, ``N`` its number in the file). The token size is the
    metadata's, else what the file sizes say. Files written with ``shuffle_chunk_size`` hold
    chunks, not documents, in their index: each chunk is imported as a document. datatrove is
    not needed.

    Args:
        paths: ``.ds`` files (or their ``.ds.index``), or directories of them (every ``.ds``
            in name order), local; their documents follow each other in this order.
        dest, vocab_size, eod_id, max_shard_tokens, name, s3, requests, on_tokens: as
            :func:`import_megatron` (``eod_id``: the id of datatrove's ``eos_token``, if any).
        tokenizer: recorded in ``tokens.bin``; default the tokenizer the metadata names.

    Raises:
        SourceNotFoundError: a ``.ds`` or its ``.ds.index`` is missing (named).
        SourceError: sizes disagree (a truncated ``.ds``), damaged ends or metadata, a token id
            not below ``vocab_size``, or two files of one name.
        DestinationError: ``dest`` holds files already.
    """
    given = _given(paths, "import_datatrove needs at least one .ds file")
    sources = [_open_datatrove(p) for p in _datatrove_files(given)]
    if tokenizer is None:
        named = {s.tokenizer for s in sources if s.tokenizer}
        tokenizer = named.pop() if len(named) == 1 else None
    return _import(
        "datatrove",
        sources,
        dest,
        vocab_size=vocab_size,
        eod_id=eod_id,
        max_shard_tokens=max_shard_tokens,
        tokenizer=tokenizer,
        name=name,
        s3=s3,
        requests=requests,
        on_tokens=on_tokens,
    )


# the import itself


def _given(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], missing: str
) -> list[str | os.PathLike[str]]:
    """An importer's inputs as a list (one path, or a sequence of them); ValueError ``missing`` when none."""
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not given:
        raise ValueError(missing)
    return given


def _tokenizer_record(tokenizer: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if tokenizer is None or isinstance(tokenizer, dict):
        return tokenizer
    sha = None
    if os.path.isfile(tokenizer):
        with open(tokenizer, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {"name": tokenizer, "sha256": sha}


def _round_vocab(largest: int) -> int:
    return -(-(largest + 1) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _scan_largest(source: _Source) -> int:
    """The largest id of an input (chunked: bounded memory); refuses a negative one."""
    largest = -1
    for a in range(0, len(source.tokens), _SCAN):
        chunk = source.tokens[a : a + _SCAN]
        low = int(chunk.min())
        if low < 0:
            at = a + int(np.argmax(chunk < 0))
            raise SourceError(f"{source.path}: token {at} is {low}, not a token id; the file is damaged or not tokens")
        largest = max(largest, int(chunk.max()))
    return largest


class _Shards:
    """Documents -> shards of at most ``max_tokens`` tokens (a longer document alone), written as they fill."""

    def __init__(
        self,
        store: Store,
        *,
        dtype: np.dtype[Any],
        vocab_size: int | None,
        eod_id: int | None,
        max_tokens: int,
        name: str,
        on_tokens: Callable[[int], None] | None,
    ) -> None:
        self.store, self.dtype, self.vocab_size, self.eod_id = store, dtype, vocab_size, eod_id
        self.max_tokens, self.name, self.on_tokens = max_tokens, name, on_tokens
        self.names: list[str] = []
        self.rows: list[Any] = []
        self.lengths = LengthHistogram()
        self.largest = -1
        self.ends_with_eod = 0
        # (source, token start, token end, document lengths, document numbers) of the shard in progress
        self.pending: list[tuple[_Source, int, int, np.ndarray, np.ndarray]] = []
        self.pending_tokens = 0

    def add(self, source: _Source, ends: np.ndarray, lengths: np.ndarray, numbers: np.ndarray) -> None:
        """Documents of ``source`` (non-empty, back to back): their token ``ends``, ``lengths``, numbers."""
        cum = np.cumsum(lengths)
        i, n = 0, len(lengths)
        while i < n:
            base = int(cum[i - 1]) if i else 0
            j = int(np.searchsorted(cum, base + self.max_tokens - self.pending_tokens, side="right"))
            if j <= i:
                if self.pending_tokens:
                    self.flush()
                    continue
                j = i + 1  # longer than a shard: a shard of its own
            start = int(ends[i] - lengths[i])
            self.pending.append((source, start, int(ends[j - 1]), lengths[i:j], numbers[i:j]))
            self.pending_tokens += int(cum[j - 1]) - base
            i = j
            if self.pending_tokens >= self.max_tokens:
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        tokens = np.empty(self.pending_tokens, dtype=self.dtype)
        at = 0
        for source, start, end, lengths, numbers in self.pending:
            piece = source.tokens[start:end]
            low, high = int(piece.min()), int(piece.max())
            limit = self.vocab_size if self.vocab_size is not None else 1 << (8 * self.dtype.itemsize)
            if low < 0 or high >= limit:
                bad = np.flatnonzero((piece < 0) | (piece >= limit))[0]
                doc = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
                value = int(piece[bad])
                raise SourceError(
                    f"{source.path}: document {source.name}:{int(numbers[doc])} holds the token id {value}, "
                    + (
                        f"not below vocab_size {self.vocab_size}; give the tokenizer's vocabulary size (--vocab-size)"
                        if self.vocab_size is not None and value >= 0
                        else "not a token id: the file is damaged or not tokens"
                    )
                )
            self.largest = max(self.largest, high)
            tokens[at : at + len(piece)] = piece
            at += len(piece)
        lengths = np.concatenate([p[3] for p in self.pending])
        ids = [f"{source.name}:{n}" for source, _, _, _, numbers in self.pending for n in numbers.tolist()]
        if self.eod_id is not None:
            self.ends_with_eod += int((tokens[np.cumsum(lengths) - 1] == self.eod_id).sum())
        name = f"{self.name}-{len(self.names):06d}.tar"
        self.rows.append(write_token_shard(self.store, name, tokens, lengths, ids))
        self.names.append(name)
        self.lengths.add(lengths)
        self.pending, self.pending_tokens = [], 0
        if self.on_tokens is not None:
            self.on_tokens(len(tokens))


def _import(
    kind: str,
    sources: list[_Source],
    dest: str | os.PathLike[str],
    *,
    vocab_size: int | None,
    eod_id: int | None,
    max_shard_tokens: int,
    tokenizer: str | dict[str, Any] | None,
    name: str,
    s3: S3Config | None,
    requests: RequestConfig | None,
    on_tokens: Callable[[int], None] | None,
) -> ImportReport:
    """What :func:`import_megatron` and :func:`import_datatrove` do with the inputs they opened
    (``kind``: which, recorded as the source with their paths)."""
    recorded_tokenizer = _tokenizer_record(tokenizer)
    source = f"{kind}: " + ", ".join(s.path for s in sources)
    started = time.perf_counter()
    if max_shard_tokens < 1:
        raise ValueError(f"max_shard_tokens must be positive, not {max_shard_tokens}")
    if vocab_size is not None:
        token_dtype(vocab_size)  # ValueError when out of range
    if eod_id is not None and (eod_id < 0 or (vocab_size is not None and eod_id >= vocab_size)):
        raise ValueError(f"eod_id {eod_id} is not a token id below vocab_size {vocab_size}")
    seen: dict[str, str] = {}
    for s in sources:
        if s.name in seen:
            raise SourceError(
                f"{s.path} and {seen[s.name]} are both named {s.name!r}: their document ids ({s.name}:N) would "
                "repeat; rename one, or import them into separate datasets"
            )
        seen[s.name] = s.path
    if not any(s.num_docs for s in sources):
        raise SourceError(f"{', '.join(s.path for s in sources)}: no documents; nothing to import")
    store = open_store(os.fspath(dest), s3=s3, requests=requests)
    store.check_writable()
    held = store.list_names()
    if held:
        raise DestinationError(
            f"{store.url}: holds {len(held)} files already ({', '.join(held[:3])}, ...); an import replaces "
            "nothing: give an empty or new destination"
        )
    if vocab_size is not None:
        dtype = token_dtype(vocab_size)
    else:  # the dtype is decided before the first shard: inputs of ids wider than 16 bits are read once for it
        largest = eod_id if eod_id is not None else -1
        for s in sources:
            if s.tokens.dtype.itemsize > 2:
                largest = max(largest, _scan_largest(s))
        dtype = np.dtype("<u2") if largest < 1 << 16 else np.dtype("<u4")
    shards = _Shards(
        store,
        dtype=dtype,
        vocab_size=vocab_size,
        eod_id=eod_id,
        max_tokens=max_shard_tokens,
        name=name,
        on_tokens=on_tokens,
    )
    empty = 0
    for s in sources:
        previous = 0
        for d0 in range(0, s.num_docs, _DOC_WINDOW):
            d1 = min(s.num_docs, d0 + _DOC_WINDOW)
            ends = s.doc_ends(d0, d1)
            lengths = np.diff(ends, prepend=previous)
            previous = int(ends[-1])
            numbers = np.arange(d0, d1, dtype=np.int64)
            keep = lengths > 0
            empty += int((~keep).sum())
            if not keep.all():
                ends, lengths, numbers = ends[keep], lengths[keep], numbers[keep]
            if len(lengths) and int(lengths.max()) >= 1 << 32:
                doc = int(numbers[int(np.argmax(lengths))])
                raise SourceError(f"{s.path}: document {s.name}:{doc} holds 2**32 tokens or more; a shard cannot")
            shards.add(s, ends, lengths, numbers)
    shards.flush()
    if not shards.rows:
        raise SourceError(f"{', '.join(s.path for s in sources)}: every document is empty; nothing to import")
    if vocab_size is None:
        vocab_size = _round_vocab(max(shards.largest, eod_id if eod_id is not None else -1))
    if token_dtype(vocab_size) != dtype:  # cannot happen: the scan above decided the dtype
        raise AssertionError(f"vocab_size {vocab_size} does not fit the shards' {dtype}")
    manifest = publish_token_index(
        store,
        shards.names,
        shards.rows,
        vocab_size=vocab_size,
        eod_id=eod_id,
        tokenizer=recorded_tokenizer,
        source=source,
        lengths=shards.lengths,
    )
    build_docid_index(os.fspath(dest), s3=s3, requests=requests)
    return ImportReport(
        dest=store.url,
        sources=tuple(s.path for s in sources),
        num_shards=len(shards.rows),
        num_docs=manifest.num_docs,
        num_tokens=manifest.num_tokens,
        dtype=manifest.fields["dtype"],
        vocab_size=vocab_size,
        eod_id=eod_id,
        empty_docs=empty,
        docs_ending_with_eod=shards.ends_with_eod if eod_id is not None else None,
        seconds=time.perf_counter() - started,
    )
