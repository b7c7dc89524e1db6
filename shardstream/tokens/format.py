"""Token shards and the token index: the on-disk format of a tokenized text dataset.

A token dataset is a shardstream dataset (``index.bin``, one ``NAME.samples`` table per
shard: ``shardstream verify``, the node cache and checksums work on it as on any other) whose
shards each hold **one sample** (key: the shard's stem) of three members, in this order:

======================  ==========================================================================
``KEY.tokens.npy``      the documents' tokens, one after another, 1-D ``uint16`` where the
                        vocabulary fits (``vocab_size <= 65536``), else ``uint32``; each document
                        ends with the end-of-document token when the tokenizer has one
``KEY.doclens.npy``     ``uint32 (num_docs,)``: each document's length in tokens (its end token
                        included): the **boundaries are stored**, never guessed from an EOS scan
``KEY.docids.json.gz``  the documents' ids, a JSON list of strings (any characters), gzip
                        (mtime 0, so packs are byte-identical)
======================  ==========================================================================

Each member is a plain ``.npy`` file (``numpy.load`` reads it; ``tar xf`` then numpy, or
webdataset, reads a shard with no shardstream). The tokens of a shard are one contiguous byte
range, so a block of tokens is one ranged read.

Beside ``index.bin`` lies ``tokens.bin`` (:class:`TokenManifest`, the container of
:mod:`shardstream.index.container`, magic ``SSTOKEN\\0``): O(shards), what a reader needs to
open the dataset. Header fields: ``format`` ("shardstream-tokens"), ``version`` (1),
``dtype`` ("uint16" or "uint32"), ``vocab_size``, ``eod_id`` (null: documents end without a
token), ``tokenizer`` (a dict: ``name``, ``sha256`` of its ``tokenizer.json``, or null),
``num_shards``, ``num_tokens``, ``num_docs``, ``doc_length_percentiles`` (``{"p50": n, ...}``)
and ``source`` (what was packed or imported). Columns, one entry per shard in ``index.bin``'s
order, all int64:

==================  ============================================================
``num_tokens``      tokens in the shard
``num_docs``        documents in it
``tokens_offset``   byte of the shard where its first token starts
``doclens_offset``  byte where its document lengths start (``uint32``)
``docids_offset``   byte where its gzip'd id list starts
``docids_size``     that member's size in bytes
==================  ============================================================

The dataset's token stream is the shards' tokens in index order; token ``t`` of shard ``s``
is token ``token_starts[s] + t`` of the stream. ``docs/index-format.md`` and
``docs/tokens.md`` document the same.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import RequestConfig
from ..errors import CorruptShardError, IndexFormatError, ShardNotFoundError
from ..format import END_OF_ARCHIVE, member_header, padded_size
from ..index import DatasetIndex, container, open_index
from ..storage import LocalStore, loop, open_store

__all__ = [
    "DOCIDS_EXT",
    "DOCLENS_EXT",
    "TOKENS_EXT",
    "TOKENS_INDEX_NAME",
    "TokenIndex",
    "TokenManifest",
    "TokenShardRow",
    "token_dtype",
    "token_shard_pieces",
]

TOKENS_INDEX_NAME = "tokens.bin"
TOKENS_EXT, DOCLENS_EXT, DOCIDS_EXT = "tokens.npy", "doclens.npy", "docids.json.gz"
FORMAT = "shardstream-tokens"
VERSION = 1
MAGIC = b"SSTOKEN\x00"
COLUMNS = ("num_tokens", "num_docs", "tokens_offset", "doclens_offset", "docids_offset", "docids_size")
PERCENTILES = (1, 10, 50, 90, 99)


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """The on-disk dtype of token ids below ``vocab_size``: ``uint16`` up to 65,536 ids, else ``uint32``.

    Raises:
        ValueError: ``vocab_size`` is not positive or exceeds 2**32.
    """
    if not 0 < vocab_size <= 1 << 32:
        raise ValueError(f"vocab_size {vocab_size} must be between 1 and 2**32")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _npy_header(dtype: np.dtype[Any], n: int) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": dtype.str, "fortran_order": False, "shape": (n,)})
    return out.getvalue()


@dataclass(frozen=True)
class TokenShardRow:
    """One token shard as written: what ``index.bin``, its table and ``tokens.bin`` record.

    Attributes:
        key: the shard's one sample key; bytes: its size; crc32: of its bytes (int).
        num_tokens, num_docs: what it holds.
        tokens_offset, doclens_offset, docids_offset, docids_size: byte positions (module doc).
        members: ``(member name, payload offset, payload size)`` in shard order (its table).
    """

    key: str
    bytes: int
    crc32: int
    num_tokens: int
    num_docs: int
    tokens_offset: int
    doclens_offset: int
    docids_offset: int
    docids_size: int
    members: tuple[tuple[str, int, int], ...]

    def columns(self) -> tuple[int, ...]:
        """This shard's ``tokens.bin`` columns, in :data:`COLUMNS` order."""
        return tuple(getattr(self, name) for name in COLUMNS)


def token_shard_pieces(
    key: str, tokens: np.ndarray, doclens: np.ndarray, docids: Sequence[str]
) -> tuple[list[bytes | memoryview], TokenShardRow]:
    """A token shard's bytes (module doc), in pieces, and its row. Deterministic: the same
    documents give the same bytes.

    Args:
        key: the shard's sample key (its file name without ``.tar``).
        tokens: 1-D ``uint16`` or ``uint32``, the documents' tokens one after another.
        doclens: the documents' lengths in tokens (any integer dtype; stored as ``uint32``).
        docids: one id per document.

    Raises:
        ValueError: the lengths do not add up to the tokens, a length is not positive or does
            not fit 32 bits, the ids are not one per document, or the dtype is not uint16/uint32.
    """
    tokens = np.ascontiguousarray(tokens)
    if tokens.ndim != 1 or tokens.dtype.str not in ("<u2", "<u4"):
        raise ValueError(f"shard {key}: tokens must be 1-D little-endian uint16 or uint32, not {tokens.dtype}")
    lengths = np.asarray(doclens)
    if len(lengths) and (lengths.min() < 1 or lengths.max() >= 1 << 32):
        raise ValueError(f"shard {key}: document lengths must be between 1 and 2**32 - 1 tokens")
    lengths = lengths.astype("<u4")
    if int(lengths.sum(dtype=np.int64)) != len(tokens):
        raise ValueError(f"shard {key}: document lengths add up to {int(lengths.sum())}, not its {len(tokens)} tokens")
    if len(docids) != len(lengths):
        raise ValueError(f"shard {key}: {len(docids)} ids for {len(lengths)} documents")
    ids = gzip.compress(json.dumps(list(docids), ensure_ascii=False).encode("utf-8"), compresslevel=6, mtime=0)
    bodies = [
        (f"{key}.{TOKENS_EXT}", [_npy_header(tokens.dtype, len(tokens)), memoryview(tokens).cast("B")]),
        (f"{key}.{DOCLENS_EXT}", [_npy_header(lengths.dtype, len(lengths)), memoryview(lengths).cast("B")]),
        (f"{key}.{DOCIDS_EXT}", [ids]),
    ]
    pieces: list[bytes | memoryview] = []
    members, starts = [], []
    at = crc = 0
    for name, parts in bodies:
        size = sum(len(p) for p in parts)
        header = member_header(name, size)
        at += len(header)
        members.append((name, at, size))
        starts.append(at + len(parts[0]))  # where the array's data starts (after the npy header)
        pad = bytes(padded_size(size) - size)
        for piece in (header, *parts, pad):
            pieces.append(piece)
            crc = zlib.crc32(piece, crc)
        at += padded_size(size)
    pieces.append(END_OF_ARCHIVE)
    crc = zlib.crc32(END_OF_ARCHIVE, crc)
    row = TokenShardRow(
        key=key,
        bytes=at + len(END_OF_ARCHIVE),
        crc32=crc,
        num_tokens=len(tokens),
        num_docs=len(lengths),
        tokens_offset=starts[0],
        doclens_offset=starts[1],
        docids_offset=members[2][1],
        docids_size=members[2][2],
        members=tuple(members),
    )
    return pieces, row


class TokenManifest:
    """``tokens.bin`` (module doc): the token columns of every shard, and the dataset's fields.

    Attributes:
        url: where it was read from (named in errors).
        fields: the header fields (``dtype``, ``vocab_size``, ``eod_id``, ``tokenizer``, ...).
        columns: name -> int64 array of shape ``(num_shards,)``.
    """

    def __init__(self, *, url: str, fields: dict[str, Any], columns: dict[str, np.ndarray]) -> None:
        self.url, self.fields, self.columns = url, fields, columns

    def __repr__(self) -> str:
        return f"TokenManifest({self.url!r}, num_shards={self.num_shards}, num_tokens={self.num_tokens})"

    @property
    def num_shards(self) -> int:
        return len(self.columns["num_tokens"])

    @property
    def num_tokens(self) -> int:
        return int(self.columns["num_tokens"].sum())

    @property
    def num_docs(self) -> int:
        return int(self.columns["num_docs"].sum())

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype("<u2") if self.fields["dtype"] == "uint16" else np.dtype("<u4")

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[Sequence[int]],
        *,
        dtype: np.dtype[Any] | str,
        vocab_size: int | None,
        eod_id: int | None,
        tokenizer: dict[str, Any] | None = None,
        source: str = "",
        doc_length_percentiles: dict[str, int] | None = None,
        url: str = TOKENS_INDEX_NAME,
    ) -> TokenManifest:
        """A manifest from per-shard rows (:meth:`TokenShardRow.columns`), in index order.
        ``doc_length_percentiles`` (``{"p50": 812, ...}``; :func:`doc_length_percentiles`)
        is recorded as given."""
        array = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(COLUMNS))
        columns = {name: np.ascontiguousarray(array[:, i]) for i, name in enumerate(COLUMNS)}
        fields: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": "uint16" if np.dtype(dtype).itemsize == 2 else "uint32",
            "vocab_size": vocab_size,
            "eod_id": eod_id,
            "tokenizer": tokenizer,
            "num_shards": len(rows),
            "num_tokens": int(columns["num_tokens"].sum()),
            "num_docs": int(columns["num_docs"].sum()),
            "doc_length_percentiles": doc_length_percentiles or {},
            "source": source,
        }
        return cls(url=url, fields=fields, columns=columns)

    def pieces(self) -> list[bytes]:
        """The file's bytes, in pieces."""
        return list(container.to_pieces(MAGIC, self.fields, [(n, self.columns[n].astype("<i8")) for n in COLUMNS]))

    @classmethod
    def parse(cls, buffer: Any, *, url: str) -> TokenManifest:
        """A manifest from the bytes of ``tokens.bin``, validated.

        Raises:
            IndexFormatError: not a token index, another version, or columns that disagree.
        """
        fields, columns = container.read(buffer, magic=MAGIC, url=url, kind="token index")
        if fields.get("format") != FORMAT or fields.get("version") != VERSION:
            raise IndexFormatError(
                f"{url}: token index version {fields.get('version')!r} is not supported (reads {VERSION}); "
                "upgrade shardstream or re-run shardstream pack-text"
            )
        for name in COLUMNS:
            if name not in columns or columns[name].dtype.str != "<i8":
                raise IndexFormatError(f"{url}: column {name!r} missing or not int64; re-run shardstream pack-text")
        n = {len(columns[name]) for name in COLUMNS}
        if len(n) != 1 or fields.get("dtype") not in ("uint16", "uint32"):
            raise IndexFormatError(f"{url}: columns of different lengths or a bad dtype; re-run shardstream pack-text")
        manifest = cls(url=url, fields=fields, columns={name: columns[name] for name in COLUMNS})
        if fields.get("num_tokens") != manifest.num_tokens or fields.get("num_docs") != manifest.num_docs:
            raise IndexFormatError(f"{url}: totals disagree with the shards' columns; re-run shardstream pack-text")
        if (manifest.columns["num_tokens"] < 0).any() or (manifest.columns["num_docs"] < 0).any():
            raise IndexFormatError(f"{url}: negative counts; re-run shardstream pack-text")
        return manifest


def doc_length_percentiles(lengths: np.ndarray) -> dict[str, int]:
    """``{"p1": .., "p10": .., "p50": .., "p90": .., "p99": .., "max": ..}`` of document lengths in tokens."""
    if not len(lengths):
        return {}
    values = np.percentile(lengths, PERCENTILES, method="lower")
    out = {f"p{p}": int(v) for p, v in zip(PERCENTILES, values)}
    out["max"] = int(np.max(lengths))
    return out


class TokenIndex:
    """An opened token dataset: its :class:`~shardstream.index.DatasetIndex`, its
    :class:`TokenManifest`, and reads of tokens, document lengths and ids (ranged reads of
    the shards, from any store). Pickles small (workers re-open the store).

    Attributes:
        index: the dataset index (shard URLs, sizes, CRC-32s).
        tokens: the token manifest.
        token_starts: int64 ``(num_shards + 1,)``: where each shard's tokens start in the stream.
        doc_starts: int64 ``(num_shards + 1,)``: the same for documents.
    """

    def __init__(self, index: DatasetIndex, tokens: TokenManifest) -> None:
        if tokens.num_shards != index.num_shards:
            raise IndexFormatError(
                f"{tokens.url}: {tokens.num_shards} shards but {index.root}/index.bin has {index.num_shards}; "
                "the two were written by different packs: re-run shardstream pack-text"
            )
        self.index, self.tokens = index, tokens
        self.token_starts = np.concatenate([[0], np.cumsum(tokens.columns["num_tokens"])]).astype(np.int64)
        self.doc_starts = np.concatenate([[0], np.cumsum(tokens.columns["num_docs"])]).astype(np.int64)
        self._store: Any = None

    def __repr__(self) -> str:
        return f"TokenIndex({self.index.root!r}, num_shards={self.num_shards}, num_tokens={self.num_tokens})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @classmethod
    def open(
        cls, location: str | os.PathLike[str], *, s3: Any = None, requests: RequestConfig | None = None
    ) -> TokenIndex:
        """Open the token dataset at ``location`` (a directory or remote prefix with ``index.bin``
        and ``tokens.bin``).

        Raises:
            ShardNotFoundError: no dataset there; ValueError: a dataset, but not of tokens
                (says to run ``shardstream pack-text``); IndexFormatError: a damaged index.
        """
        return cls.of_index(open_index(location, s3=s3, requests=requests))

    @classmethod
    def of_index(cls, index: DatasetIndex) -> TokenIndex:
        """The token dataset of an opened dataset index (reads its ``tokens.bin``: one GET).

        Raises:
            ValueError, IndexFormatError: as :meth:`open`.
        """
        store = open_store(index.root, s3=index.s3, requests=index.requests)
        try:
            data = store.read_bytes(TOKENS_INDEX_NAME)
        except ShardNotFoundError:
            raise ValueError(
                f"{index.root}: a dataset of samples, not of tokens (no {TOKENS_INDEX_NAME}); pack text with "
                "shardstream pack-text, or import Megatron or datatrove files with shardstream import-tokens"
            ) from None
        return cls(index, TokenManifest.parse(data, url=store.url_of(TOKENS_INDEX_NAME)))

    @property
    def num_shards(self) -> int:
        return self.index.num_shards

    @property
    def num_tokens(self) -> int:
        return int(self.token_starts[-1])

    @property
    def num_docs(self) -> int:
        return int(self.doc_starts[-1])

    @property
    def dtype(self) -> np.dtype[Any]:
        """The tokens' dtype on disk (``<u2`` or ``<u4``)."""
        return self.tokens.dtype

    @property
    def vocab_size(self) -> int | None:
        """Token ids are below it (None where not recorded)."""
        value = self.tokens.fields.get("vocab_size")
        return None if value is None else int(value)

    @property
    def eod_id(self) -> int | None:
        value = self.tokens.fields.get("eod_id")
        return None if value is None else int(value)

    def shard_url(self, shard: int) -> str:
        return self.index.shard_url(shard)

    def column(self, name: str, shard: int) -> int:
        return int(self.tokens.columns[name][shard])

    def read_range(self, shard: int, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of shard ``shard``: one ranged read (a pread locally).

        Raises:
            ShardNotFoundError: the shard is missing; CorruptShardError: it is shorter than
                the index says; StorageError: the store failed.
        """
        store = self._get_store()
        name = self.index.manifest.name(shard)
        if isinstance(store, LocalStore):
            with store.open_read(name, buffer_bytes=0) as f:
                data = os.pread(f.fileno(), end - start, start)
        else:
            future = loop.submit(store.get_range(name, start, end))
            pieces, _, _ = loop.result_within(future, store, store.url_of(name))
            data = b"".join(pieces)
        if len(data) != end - start:
            raise CorruptShardError(
                f"{self.shard_url(shard)}: {len(data)} bytes at {start} where the token index says {end - start}; "
                "the shard is truncated or was replaced: re-pack or re-upload it"
            )
        return data

    def read_tokens(self, shard: int, start: int, stop: int) -> np.ndarray:
        """Tokens ``start..stop-1`` of ``shard`` (its own numbering), in the on-disk dtype."""
        size = self.dtype.itemsize
        at = self.column("tokens_offset", shard)
        return np.frombuffer(self.read_range(shard, at + start * size, at + stop * size), dtype=self.dtype)

    def doclens(self, shard: int) -> np.ndarray:
        """uint32 ``(num_docs,)``: the lengths of ``shard``'s documents, in tokens (one ranged read).

        Raises:
            CorruptShardError: they do not add up to the shard's tokens.
        """
        n = self.column("num_docs", shard)
        at = self.column("doclens_offset", shard)
        lengths = np.frombuffer(self.read_range(shard, at, at + 4 * n), dtype="<u4")
        if int(lengths.sum(dtype=np.int64)) != self.column("num_tokens", shard):
            raise CorruptShardError(
                f"{self.shard_url(shard)}: document lengths add up to {int(lengths.sum(dtype=np.int64))} tokens, "
                f"the token index says {self.column('num_tokens', shard)}; re-pack the dataset"
            )
        return lengths

    def docids(self, shard: int) -> list[str]:
        """The ids of ``shard``'s documents, in shard order (one ranged read)."""
        at = self.column("docids_offset", shard)
        raw = self.read_range(shard, at, at + self.column("docids_size", shard))
        try:
            ids = json.loads(gzip.decompress(raw).decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise CorruptShardError(f"{self.shard_url(shard)}: damaged document ids ({exc}); re-pack it") from exc
        if not isinstance(ids, list) or len(ids) != self.column("num_docs", shard):
            raise CorruptShardError(f"{self.shard_url(shard)}: document ids disagree with the token index; re-pack it")
        return ids

    def document(self, shard: int, doc: int) -> np.ndarray:
        """The tokens of document ``doc`` of ``shard`` (its end token included), on-disk dtype."""
        lengths = self.doclens(shard)
        if not 0 <= doc < len(lengths):
            raise IndexError(f"{self.shard_url(shard)}: document {doc} of {len(lengths)}")
        start = int(lengths[:doc].sum(dtype=np.int64))
        return self.read_tokens(shard, start, start + int(lengths[doc]))

    def locate(self, position: int) -> tuple[int, int]:
        """``(shard, token within it)`` of token ``position`` of the stream (a shard with
        tokens; an empty one is never named)."""
        if not 0 <= position < self.num_tokens:
            raise IndexError(f"token {position} of {self.num_tokens}")
        shard = int(np.searchsorted(self.token_starts, position, side="right")) - 1
        return shard, position - int(self.token_starts[shard])

    def stream_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``start..stop-1`` of the dataset's stream, across shard ends (one ranged read
        per shard met), in the on-disk dtype."""
        out, at = [], start
        while at < stop:
            shard, t = self.locate(at)
            take = min(stop - at, self.column("num_tokens", shard) - t)
            out.append(self.read_tokens(shard, t, t + take))
            at += take
        return np.concatenate(out) if out else np.zeros(0, self.dtype)

    def _get_store(self) -> Any:
        if self._store is None:
            self._store = open_store(self.index.root, s3=self.index.s3, requests=self.index.requests)
        return self._store
