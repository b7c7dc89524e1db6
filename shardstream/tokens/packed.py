"""Documents packed whole into fixed-length blocks, for fine-tuning data (no torch): the
:class:`PackedDocumentUnit` (an :class:`~shardstream.reading.stages.ItemUnit` whose item is a
*bin*), its shards (:class:`PackedShards`) and tables (:class:`PackedTable`).

**The packing rule.** Each shard's documents are taken in windows of ``window`` consecutive
documents; a window's documents are packed best-fit decreasing into bins of ``seq_len``
tokens (longest first, each into the fullest bin it fits, a new bin where none does); bins
are numbered in window order, within a window in the order they were opened. A document is
never cut, but one longer than ``seq_len``, which no bin holds: it is cut into pieces of
``seq_len`` tokens (the last shorter), each packed as a document of its own (the one cut
this mode makes, counted as pieces in ``doc_lens``). The rule depends on a shard's document
lengths alone, so every reader works out the same bins, and an epoch reads every bin once:
every document exactly once. The bins of a shard are counted when the dataset is opened,
from every shard's document lengths (4 bytes a document, read once per process: O(documents),
the one exception to O(shards) at open, made for fine-tuning sets of up to some 10^8
documents; blocks across documents (:mod:`.blocks`) stay O(shards)).

A bin's item is ``{"__key__": bin number, "__shard__": url, "tokens": its documents' tokens
(at most seq_len), "doc_lens": int32 lengths of its documents}``; the torch side pads it to
``seq_len`` and masks the padding in the labels (:class:`~.dataset.PackedTensors`).
"""

from __future__ import annotations

import bisect
import concurrent.futures
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..reading.shards import ShardSet
from ..tarstream import Batch
from .blocks import TokenShards, _Cursor, token_index_of
from .format import TokenIndex

__all__ = ["PackedDocumentUnit", "PackedShards", "PackedTable", "pack_bins"]

DEFAULT_WINDOW = 1000


def pack_bins(lengths: np.ndarray, seq_len: int, window: int = DEFAULT_WINDOW) -> list[list[tuple[int, int, int]]]:
    """The bins of one shard's documents (module doc): each a list of ``(document, first
    token within it, tokens)`` pieces, in bin order.

    Args:
        lengths: the documents' lengths in tokens, in shard order.
        seq_len: a bin's capacity in tokens.
        window: documents packed together.
    """
    bins: list[list[tuple[int, int, int]]] = []
    n = len(lengths)
    for w in range(0, n, window):
        pieces = []
        for d in range(w, min(n, w + window)):
            length = int(lengths[d])
            for start in range(0, length, seq_len):
                pieces.append((d, start, min(seq_len, length - start)))
        pieces.sort(key=lambda p: (-p[2], p[0], p[1]))  # longest first; ties in shard order
        opened: list[list[tuple[int, int, int]]] = []
        room: list[tuple[int, int]] = []  # (tokens left, bin), sorted: the fullest bin that fits is a bisect away
        for piece in pieces:
            size = piece[2]
            k = bisect.bisect_left(room, (size, -1))
            if k == len(room):
                opened.append([piece])
                bisect.insort(room, (seq_len - size, len(opened) - 1))
            else:
                left, b = room.pop(k)
                opened[b].append(piece)
                bisect.insort(room, (left - size, b))
        for bin_ in opened:
            bin_.sort()  # a bin's documents in shard order
        bins += opened
    return bins


class PackedTable:
    """The bins of one shard (module doc) and how to cut them out of its bytes."""

    def __init__(
        self,
        *,
        url: str,
        first_bin: int,
        bins: list[list[tuple[int, int, int]]],
        doc_starts: np.ndarray,
        tokens_offset: int,
        dtype: np.dtype[Any],
        window: int,
    ) -> None:
        self.url, self.first_bin, self.bins = url, first_bin, bins
        self.doc_starts, self.tokens_offset, self.dtype = doc_starts, tokens_offset, dtype
        # each bin's token span within the shard: its documents lie in one window, read as one range
        self.lo = np.array([min(doc_starts[d] + s for d, s, _ in b) for b in bins], dtype=np.int64)
        self.hi = np.array([max(doc_starts[d] + s + k for d, s, k in b) for b in bins], dtype=np.int64)
        self.window_of = [b[0][0] // window for b in bins]  # the window of documents each bin was packed from

    @property
    def num_samples(self) -> int:
        return len(self.bins)

    def run_range(self, lo: int, hi: int) -> tuple[int, int]:
        size = self.dtype.itemsize
        return (
            self.tokens_offset + size * int(self.lo[lo : hi + 1].min()),
            self.tokens_offset + size * int(self.hi[lo : hi + 1].max()),
        )

    def batches(self, chunks: Iterator[Any], indices: np.ndarray, *, base_offset: int, url: str) -> Iterator[Batch]:
        """The bins at ``indices`` (ascending) as item dicts (module doc), cut from the shard's
        bytes from ``base_offset`` on: the wanted bins of one window of documents at a time,
        one range of bytes each (windows follow one another in the shard).

        Raises:
            CorruptShardError: the bytes end before the last wanted bin.
        """
        from ..errors import CorruptShardError

        cursor = _Cursor(chunks, base_offset)
        size, dtype, at = self.dtype.itemsize, self.dtype, self.tokens_offset
        wanted = indices.tolist()
        out = Batch()
        k = 0
        while k < len(wanted):
            w = self.window_of[wanted[k]]
            j = k
            while j < len(wanted) and self.window_of[wanted[j]] == w:
                j += 1
            group = wanted[k:j]
            lo, hi = int(self.lo[group].min()), int(self.hi[group].max())
            raw = cursor.take(at + size * lo, at + size * hi)
            if raw is None:
                raise CorruptShardError(f"{url}: ends before bin {self.first_bin + group[-1]}; re-pack or re-upload it")
            held = np.frombuffer(raw, dtype=dtype)
            for i in group:
                pieces = self.bins[i]
                parts = [held[self.doc_starts[d] + s - lo : self.doc_starts[d] + s + n - lo] for d, s, n in pieces]
                lens = np.array([n for _, _, n in pieces], dtype=np.int32)
                item = {
                    "__key__": self.first_bin + i,
                    "__shard__": url,
                    "tokens": np.concatenate(parts),
                    "doc_lens": lens,
                }
                out.append(item)
                out.nbytes += size * int(lens.sum())
                if len(out) >= 64:
                    yield out
                    out = Batch()
            k = j
        if out:
            yield out


class PackedShards(TokenShards[PackedTable]):
    """A token dataset's shards as shards of packed bins (module doc): a
    :class:`~shardstream.reading.shards.ShardSet` whose ``sample_counts`` are bins.

    Args:
        tokens: the opened token dataset; seq_len: a bin's tokens; window: documents packed together.
    """

    def __init__(self, tokens: TokenIndex, seq_len: int, window: int = DEFAULT_WINDOW) -> None:
        self.tokens, self.seq_len, self.window = tokens, seq_len, window
        self.num_shards = tokens.num_shards
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            counts = list(pool.map(lambda s: len(self._bins(s)[0]), range(self.num_shards)))
        self.sample_counts: np.ndarray | None = np.asarray(counts, dtype=np.int64)
        self.bin_starts = np.concatenate([[0], np.cumsum(self.sample_counts)]).astype(np.int64)

    def __repr__(self) -> str:
        return f"PackedShards({self.tokens!r}, seq_len={self.seq_len}, num_bins={int(self.bin_starts[-1])})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def _bins(self, shard: int) -> tuple[list[list[tuple[int, int, int]]], np.ndarray]:
        lengths = self.tokens.doclens(shard) if self.tokens.column("num_docs", shard) else np.zeros(0, np.uint32)
        starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        return pack_bins(lengths, self.seq_len, self.window), starts

    def table(self, shard: int) -> PackedTable:
        bins, starts = self._bins(shard)
        return PackedTable(
            url=self.url(shard),
            first_bin=int(self.bin_starts[shard]),
            bins=bins,
            doc_starts=starts,
            tokens_offset=self.tokens.column("tokens_offset", shard),
            dtype=self.tokens.dtype,
            window=self.window,
        )


@dataclass(frozen=True)
class PackedDocumentUnit:
    """The item unit of packed bins (module doc): documents packed whole, best-fit, into bins
    of ``seq_len`` tokens. Its name, recorded in checkpoints, holds ``seq_len`` and ``window``.

    Raises:
        ValueError: ``seq_len`` or ``window`` below 1; a dataset that is not of tokens.
    """

    seq_len: int
    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        for name in ("seq_len", "window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")

    @property
    def name(self) -> str:
        return f"packed_documents:{self.seq_len}:{self.window}"

    def items_of(self, shards: ShardSet) -> ShardSet:
        return PackedShards(token_index_of(shards, "packed documents"), self.seq_len, self.window)

    def stages(self) -> Sequence[Any]:
        return ()
