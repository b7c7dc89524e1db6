"""Writing token datasets (:mod:`.format`): one shard (:func:`write_token_shard`), the
indexes once every shard is written (:func:`publish_token_index`), and a sequential writer of
documents (:class:`TokenDatasetWriter`, what the importers and small jobs use; ``pack-text``
writes the same shards from parallel, resumable streams).

A shard is published whole (its table after it); ``tokens.bin`` goes before ``index.bin``,
which is written last: a dataset without ``index.bin`` is not done, and readers say so.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import RequestConfig, S3Config
from ..errors import DestinationError
from ..index import MANIFEST_NAME, TABLE_SUFFIX, Manifest, TableSpool
from ..storage import Store, open_store, write_pieces
from .format import TOKENS_INDEX_NAME, TokenManifest, TokenShardRow, token_dtype, token_shard_pieces

__all__ = [
    "DEFAULT_MAX_SHARD_TOKENS",
    "LengthHistogram",
    "TokenDatasetWriter",
    "publish_token_index",
    "write_token_shard",
]

DEFAULT_MAX_SHARD_TOKENS = 1 << 26  # 64 Mi tokens: 128 MiB of uint16 a shard
_EXACT = 1024  # lengths below this get a bin each; above, 64 bins an octave (1.1% apart)
_PER_OCTAVE = 64


def write_token_shard(
    store: Store, name: str, tokens: np.ndarray, doclens: np.ndarray, docids: Sequence[str]
) -> TokenShardRow:
    """Write token shard ``name`` (``KEY.tar``) and its table ``name.samples`` into ``store``:
    the shard published whole, then its table. Returns its row.

    Raises:
        ValueError: as :func:`~.format.token_shard_pieces`; StorageError: the store failed.
    """
    key = name[: -len(".tar")] if name.endswith(".tar") else name
    pieces, row = token_shard_pieces(key, tokens, doclens, docids)
    write_pieces(store, name, pieces)  # type: ignore[arg-type]  # memoryviews write as bytes do
    table = TableSpool(name)
    try:
        table.add(key, list(row.members))
        write_pieces(store, name + TABLE_SUFFIX, table.pieces())
    finally:
        table.close()
    return row


class LengthHistogram:
    """Document lengths counted into bins (exact below 1,024 tokens, then 64 an octave): O(1)
    memory however many documents, mergeable across streams, percentiles within 1.1%."""

    def __init__(self, counts: dict[int, int] | None = None) -> None:
        self.counts: dict[int, int] = dict(counts or {})

    @staticmethod
    def bins(lengths: np.ndarray) -> np.ndarray:
        lengths = np.asarray(lengths, dtype=np.int64)
        big = np.maximum(lengths, _EXACT).astype(np.float64)
        log_bins = _EXACT + np.floor(_PER_OCTAVE * np.log2(big / _EXACT)).astype(np.int64)
        return np.where(lengths < _EXACT, lengths, log_bins)

    @staticmethod
    def lower_edge(b: int) -> int:
        return b if b < _EXACT else math.ceil(_EXACT * 2 ** ((b - _EXACT) / _PER_OCTAVE))

    def add(self, lengths: np.ndarray) -> None:
        values, counts = np.unique(self.bins(lengths), return_counts=True)
        for b, c in zip(values.tolist(), counts.tolist()):
            self.counts[b] = self.counts.get(b, 0) + c

    def merge(self, other: LengthHistogram) -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c

    def to_json(self) -> dict[str, int]:
        return {str(b): c for b, c in sorted(self.counts.items())}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> LengthHistogram:
        return cls({int(b): int(c) for b, c in data.items()})

    def percentiles(self) -> dict[str, int]:
        """``{"p1", "p10", "p50", "p90", "p99", "max"}``: lengths in tokens (a bin's lower edge)."""
        if not self.counts:
            return {}
        keys = sorted(self.counts)
        cum = np.cumsum([self.counts[b] for b in keys])
        total = int(cum[-1])
        out = {}
        for p in (1, 10, 50, 90, 99):
            i = int(np.searchsorted(cum, max(1, math.ceil(p / 100 * total))))
            out[f"p{p}"] = self.lower_edge(keys[i])
        out["max"] = self.lower_edge(keys[-1])
        return out


def publish_token_index(
    store: Store,
    names: Sequence[str],
    rows: Sequence[TokenShardRow],
    *,
    vocab_size: int,
    eod_id: int | None,
    tokenizer: dict[str, Any] | None = None,
    source: str = "",
    lengths: LengthHistogram | None = None,
) -> TokenManifest:
    """Write ``tokens.bin``, then ``index.bin`` (last: the dataset is done once it exists),
    for shards ``names`` (file names, in dataset order) with their ``rows``. Returns the token manifest."""
    tokens = TokenManifest.from_rows(
        [row.columns() for row in rows],
        dtype=token_dtype(vocab_size),
        vocab_size=vocab_size,
        eod_id=eod_id,
        tokenizer=tokenizer,
        source=source,
        doc_length_percentiles=lengths.percentiles() if lengths is not None else None,
        url=store.url_of(TOKENS_INDEX_NAME),
    )
    write_pieces(store, TOKENS_INDEX_NAME, tokens.pieces())
    manifest = Manifest.from_columns(
        names=names,
        shard_bytes=[row.bytes for row in rows],
        shard_samples=[1] * len(rows),
        shard_members=[len(row.members) for row in rows],
        crc32=[row.crc32 for row in rows],
        url=store.url_of(MANIFEST_NAME),
    )
    write_pieces(store, MANIFEST_NAME, manifest.pieces())
    return tokens


@dataclass
class _Pending:
    tokens: list[np.ndarray] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    num_tokens: int = 0


class TokenDatasetWriter:
    """Documents -> a token dataset at ``dest``, one after another (sequential; ``pack-text``
    packs in parallel). Shards close at ``max_shard_tokens`` (a document never splits: a
    longer one makes a shard of its own); :meth:`close` writes the indexes. Use as a context
    manager: leaving on an exception writes no index (the shards stay, named in the error).

    Args:
        dest: a local directory or remote prefix that holds nothing yet.
        vocab_size: ids are below it (decides uint16 or uint32 on disk).
        eod_id: the end-of-document token recorded in the index (the caller appends it to
            each document's tokens), or None.
        name: shards are ``NAME-000000.tar``, ...
        tokenizer, source: recorded in ``tokens.bin``.
        docids: build the document-id index ``docids/`` at :meth:`close` (``get(doc_id)``).

    Raises:
        DestinationError: ``dest`` already holds files (this writer replaces nothing).
    """

    def __init__(
        self,
        dest: str | os.PathLike[str],
        *,
        vocab_size: int,
        eod_id: int | None = None,
        max_shard_tokens: int = DEFAULT_MAX_SHARD_TOKENS,
        name: str = "tokens",
        tokenizer: dict[str, Any] | None = None,
        source: str = "",
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        docids: bool = True,
    ) -> None:
        if max_shard_tokens < 1:
            raise ValueError(f"max_shard_tokens must be positive, not {max_shard_tokens}")
        self.store = open_store(os.fspath(dest), s3=s3, requests=requests)
        self.store.check_writable()
        held = self.store.list_names()
        if held:
            raise DestinationError(
                f"{self.store.url}: holds {len(held)} files already ({', '.join(held[:3])}, ...); "
                "a token writer replaces nothing: give an empty or new destination"
            )
        self.vocab_size, self.eod_id, self.name = vocab_size, eod_id, name
        self.dtype = token_dtype(vocab_size)
        self.max_shard_tokens = max_shard_tokens
        self.tokenizer, self.source = tokenizer, source
        self.s3, self.requests, self.docids = s3, requests, docids
        self.names: list[str] = []
        self.rows: list[TokenShardRow] = []
        self.lengths = LengthHistogram()
        self._pending = _Pending()
        self._closed = False

    def __enter__(self) -> TokenDatasetWriter:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            self.close()
        else:
            self._closed = True

    def add(self, tokens: np.ndarray | Sequence[int], doc_id: str) -> None:
        """One document: its tokens (the end token included, if any) and its id.

        Raises:
            ValueError: no tokens, or an id at or above ``vocab_size`` (or negative).
        """
        array = np.asarray(tokens)
        if array.ndim != 1 or not len(array):
            raise ValueError(f"document {doc_id!r}: tokens must be a non-empty 1-D sequence")
        if array.dtype != self.dtype:
            if len(array) and (int(array.min()) < 0 or int(array.max()) >= self.vocab_size):
                raise ValueError(f"document {doc_id!r}: a token id outside 0..{self.vocab_size - 1}")
            array = array.astype(self.dtype)
        pending = self._pending
        if pending.num_tokens and pending.num_tokens + len(array) > self.max_shard_tokens:
            self.flush()
            pending = self._pending
        pending.tokens.append(array)
        pending.lengths.append(len(array))
        pending.ids.append(str(doc_id))
        pending.num_tokens += len(array)

    def flush(self) -> None:
        """Write the shard in progress (if it holds a document)."""
        pending = self._pending
        if not pending.lengths:
            return
        name = f"{self.name}-{len(self.names):06d}.tar"
        lengths = np.asarray(pending.lengths, dtype=np.int64)
        row = write_token_shard(self.store, name, np.concatenate(pending.tokens), lengths, pending.ids)
        self.lengths.add(lengths)
        self.names.append(name)
        self.rows.append(row)
        self._pending = _Pending()

    def close(self) -> TokenManifest | None:
        """Write the last shard and the indexes (once), then the document-id index ``docids/``."""
        if self._closed:
            return None
        self._closed = True
        self.flush()
        tokens = publish_token_index(
            self.store,
            self.names,
            self.rows,
            vocab_size=self.vocab_size,
            eod_id=self.eod_id,
            tokenizer=self.tokenizer,
            source=self.source,
            lengths=self.lengths,
        )
        if self.docids:
            from .docids import build_docid_index  # (docids reads the dataset the lines above wrote)

            build_docid_index(self.store.url, s3=self.s3, requests=self.requests)
        return tokens
