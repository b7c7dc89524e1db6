"""Fixed-length token blocks as the reading pipeline's items (no torch): the block rule, the
:class:`TokenBlockUnit` (an :class:`~shardstream.reading.stages.ItemUnit`), and the shards of
blocks the schedule and the engines read (:class:`BlockShards`, :class:`BlockTable`).

**The block rule.** A source's token stream is its shards' tokens in index order (documents
end with their end token). With ``seq_len = L``, block ``k`` is tokens ``kL .. kL + L`` of
the stream (``L + 1`` tokens: ``input_ids`` the first ``L``, ``labels`` the last ``L``), for
``k = 0 .. B - 1``, ``B = (num_tokens - 1) // L``. So blocks cut across documents and across
shard ends, every token is an input of exactly one block an epoch, and consecutive blocks
share one token (the last label of one is the first input of the next, as Megatron's
samples do, so no token is lost as a label). The last ``num_tokens - B*L`` tokens (at most
``L``) are in no block: the documented policy for the last partial block (a padded block
would break equal blocks per rank). Each block also carries ``doc_lens``: the lengths of the
pieces of documents among its ``L`` inputs, from the **stored** boundaries (a document that
starts before the block, or runs past it, counts only its piece inside).

**How they are read.** A block belongs to the shard it starts in; :class:`BlockShards`
presents a token dataset to the schedule and the engines as shards of blocks (its
``sample_counts`` are blocks, not documents), so shard-order shuffle, the shuffle buffer,
per-rank and per-worker pieces, exact and elastic resume, mixtures (weights then count
blocks, i.e. tokens), the node cache and every store work as for samples. A run of blocks of
one shard is one byte range of its tokens (one ranged read of many blocks);
:class:`BlockTable` cuts blocks out of it and adds, for the one block that runs past the
shard's end, the first tokens of the next shard(s), read with that shard's document lengths
when the table is asked for (beside the shard's own bytes): a block across a shard end costs
one more small ranged read, never one GET per block.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import itertools
import operator
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from ..reading.shards import ShardSet
from ..tarstream import Batch, Pieces, Window
from .format import TokenIndex

__all__ = ["BlockAccess", "BlockShards", "BlockTable", "TokenBlockUnit", "block_count"]

_BATCH_BLOCKS = 64  # blocks handed on together
_POOL_THREADS = 8
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def block_count(num_tokens: int, seq_len: int) -> int:
    """Blocks of ``seq_len + 1`` tokens (consecutive ones share one) in a stream of
    ``num_tokens``: ``(num_tokens - 1) // seq_len``."""
    return max(0, (num_tokens - 1) // seq_len)


def _background() -> concurrent.futures.ThreadPoolExecutor:
    """This process's threads for the tables' reads (made anew after a fork)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = concurrent.futures.ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="shardstream-blocks")
            _pool_pid = os.getpid()
        return _pool


class BlockTable:
    """The blocks that start in one shard (module doc), and how to cut them out of the shard's bytes.

    Attributes:
        shard: the shard's number; url: its URL (named in errors).
        first_block: the stream's number of the shard's first block; num_blocks: how many start in it.
    """

    def __init__(
        self,
        *,
        shard: int,
        url: str,
        seq_len: int,
        first_block: int,
        num_blocks: int,
        token_start: int,
        num_tokens: int,
        tokens_offset: int,
        dtype: np.dtype[Any],
        doc_ends: np.ndarray,
        tail: np.ndarray,
    ) -> None:
        self.shard, self.url, self.seq_len = shard, url, seq_len
        self.first_block, self.num_blocks = first_block, num_blocks
        self.token_start, self.num_tokens = token_start, num_tokens
        self.tokens_offset, self.dtype = tokens_offset, dtype
        self.doc_ends = doc_ends  # int64, stream positions where documents end (exclusive), ascending
        self.tail = tail  # the tokens after this shard's that its last block needs (maybe none)
        self._ends_list: list[int] | None = None

    def __repr__(self) -> str:
        return f"BlockTable({self.url!r}, first_block={self.first_block}, num_blocks={self.num_blocks})"

    @property
    def num_samples(self) -> int:
        return self.num_blocks

    def _token_range(self, i: int) -> tuple[int, int]:
        """Block ``i`` of this shard as tokens of the shard: ``[a, b)``, ``b`` clipped at its end."""
        start = (self.first_block + i) * self.seq_len - self.token_start
        return start, min(self.num_tokens, start + self.seq_len + 1)

    def run_range(self, lo: int, hi: int) -> tuple[int, int]:
        """The byte range of the shard that holds blocks ``lo..hi`` (within its tokens)."""
        size, at = self.dtype.itemsize, self.tokens_offset
        return at + size * self._token_range(lo)[0], at + size * self._token_range(hi)[1]

    def doc_lens(self, block: int) -> np.ndarray:
        """int32: the lengths of the document pieces among block ``block``'s inputs (stream numbering)."""
        a = block * self.seq_len
        b = a + self.seq_len
        ends = self._ends_list
        if ends is None:
            ends = self._ends_list = self.doc_ends.tolist()  # bisect on a list: ~1 us a block, numpy ~10
        inner = ends[bisect.bisect_right(ends, a) : bisect.bisect_left(ends, b)]
        if not inner:
            return np.array((self.seq_len,), dtype=np.int32)
        inner.append(b)
        lens = [inner[0] - a]
        lens += [y - x for x, y in itertools.pairwise(inner)]
        return np.array(lens, dtype=np.int32)

    def batches(self, chunks: Iterator[Any], indices: np.ndarray, *, base_offset: int, url: str) -> Iterator[Batch]:
        """The blocks at ``indices`` (ascending) as item dicts ``{"__key__": block number,
        "__shard__": url, "tokens": (seq_len + 1,) on-disk dtype, "doc_lens": int32}``, in
        batches, cut from ``chunks``: the shard's bytes from ``base_offset`` on.

        Raises:
            CorruptShardError: the bytes end before the last wanted block.
        """
        from ..errors import CorruptShardError

        cursor = _Cursor(chunks, base_offset)
        size, dtype = self.dtype.itemsize, self.dtype
        out, nbytes = Batch(), 0
        for i in indices.tolist():
            a, b = self._token_range(i)
            raw = cursor.take(self.tokens_offset + size * a, self.tokens_offset + size * b)
            if raw is None:
                raise CorruptShardError(f"{url}: ends before block {self.first_block + i}; re-pack or re-upload it")
            tokens = np.frombuffer(raw, dtype=dtype)
            if b - a < self.seq_len + 1:
                tokens = np.concatenate((tokens, self.tail[: self.seq_len + 1 - (b - a)]))
            block = self.first_block + i
            out.append({"__key__": block, "__shard__": url, "tokens": tokens, "doc_lens": self.doc_lens(block)})
            nbytes += size * (self.seq_len + 1)
            if len(out) >= _BATCH_BLOCKS:
                out.nbytes = nbytes
                yield out
                out, nbytes = Batch(), 0
        if out:
            out.nbytes = nbytes
            yield out


class _Cursor:
    """Byte ranges of a shard, going forward (ranges may overlap the one before by a token),
    taken from its chunks (``bytes``, a memory map, a :class:`~shardstream.tarstream.Window`
    or :class:`~shardstream.tarstream.Pieces`) without copying a range that lies in one chunk."""

    def __init__(self, chunks: Iterator[Any], base: int) -> None:
        self.chunks = chunks
        self.held: list[tuple[int, Any]] = []  # (absolute start, buffer) of the chunks kept
        self.end = base  # where the bytes held end

    def _pull(self) -> bool:
        for chunk in self.chunks:
            for piece in _buffers(chunk):
                if len(piece):
                    self.held.append((self.end, piece))
                    self.end += len(piece)
            return True
        return False

    def take(self, start: int, end: int) -> Any:
        while self.end < end:
            if not self._pull():
                return None
        while len(self.held) > 1 and self.held[1][0] <= start:
            self.held.pop(0)
        first_at, first = self.held[0]
        if end - first_at <= len(first):  # copied: a view would pin a memory map the stream closes
            return bytes(first[start - first_at : end - first_at])
        parts = []
        for at, buf in self.held:
            if at >= end:
                break
            lo, hi = max(start, at) - at, min(end, at + len(buf)) - at
            if hi > lo:
                parts.append(bytes(buf[lo:hi]))
        return b"".join(parts)


def _buffers(chunk: Any) -> list[Any]:
    """A chunk as buffers that slice without copying (memoryviews)."""
    if isinstance(chunk, Pieces):
        return [memoryview(p) for p in chunk.pieces]
    if isinstance(chunk, Window):
        mapped, start, end = chunk.window()
        return [memoryview(mapped)[start:end]]
    return [memoryview(chunk)]


_Table = TypeVar("_Table")


class TokenShards(Generic[_Table]):
    """What the shard sets of a token dataset's items (:class:`BlockShards`,
    :class:`~shardstream.tokens.packed.PackedShards`) share: their shards are the token
    dataset's (``tokens``), and a table is read in the background (:meth:`request_table`).
    """

    foreign = False
    classes: list[str] | None = None
    tokens: TokenIndex

    def url(self, shard: int) -> str:
        return self.tokens.shard_url(shard)

    def size_bytes(self, shard: int) -> int | None:
        return int(self.tokens.index.manifest.shard_bytes[shard])

    def crc32_hex(self, shard: int) -> str | None:
        return self.tokens.index.manifest.crc32_hex(shard)

    def table(self, shard: int) -> _Table:
        raise NotImplementedError

    def request_table(
        self, shard: int, *, on_retry: Callable[[BaseException], None] | None = None, cache: Any = None
    ) -> Callable[[], _Table]:
        """Start reading shard ``shard``'s table in the background; returns the function that waits for it."""
        return _background().submit(self.table, shard).result


class BlockShards(TokenShards[BlockTable]):
    """A token dataset's shards as shards of blocks (module doc): a
    :class:`~shardstream.reading.shards.ShardSet` whose ``sample_counts`` are the blocks that
    start in each shard and whose tables are :class:`BlockTable` s.

    Args:
        tokens: the opened token dataset.
        seq_len: tokens a block feeds the model (a block holds ``seq_len + 1``).
    """

    def __init__(self, tokens: TokenIndex, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        self.num_shards = tokens.num_shards
        total = block_count(tokens.num_tokens, seq_len)
        starts = tokens.token_starts
        first = np.minimum(-(-starts // seq_len), total)  # the first block starting at or after each shard start
        self.block_starts = first  # (num_shards + 1,): blocks of shard s are block_starts[s] .. block_starts[s+1]-1
        self.block_starts[-1] = total
        self.sample_counts: np.ndarray | None = np.diff(first).astype(np.int64)
        self.num_blocks = total

    def __repr__(self) -> str:
        return f"BlockShards({self.tokens!r}, seq_len={self.seq_len}, num_blocks={self.num_blocks})"

    def table(self, shard: int) -> BlockTable:
        """Shard ``shard``'s blocks: reads its document lengths, and the next shards' first
        tokens and lengths where its last block runs past its end (ranged reads)."""
        tokens, seq_len = self.tokens, self.seq_len
        first, count = int(self.block_starts[shard]), int(self.sample_counts[shard])  # type: ignore[index]
        start, n = int(tokens.token_starts[shard]), tokens.column("num_tokens", shard)
        ends = [start + np.cumsum(tokens.doclens(shard), dtype=np.int64)] if count else []
        tail = np.zeros(0, tokens.dtype)
        if count:
            need = (first + count - 1) * seq_len + seq_len + 1 - (start + n)  # tokens past this shard's end
            after, at = [], shard + 1
            while need > 0 and at < self.num_shards:
                m = tokens.column("num_tokens", at)
                take = min(need, m)
                if take:
                    after.append(tokens.read_tokens(at, 0, take))
                    lens = _head_lengths(tokens, at, take)
                    ends.append(int(tokens.token_starts[at]) + np.cumsum(lens, dtype=np.int64))
                need -= take
                at += 1
            if after:
                tail = np.concatenate(after)
        return BlockTable(
            shard=shard,
            url=self.url(shard),
            seq_len=seq_len,
            first_block=first,
            num_blocks=count,
            token_start=start,
            num_tokens=n,
            tokens_offset=tokens.column("tokens_offset", shard),
            dtype=tokens.dtype,
            doc_ends=np.concatenate(ends) if ends else np.zeros(0, np.int64),
            tail=tail,
        )


def _head_lengths(tokens: TokenIndex, shard: int, take: int) -> np.ndarray:
    """The lengths of ``shard``'s first documents that hold its first ``take`` tokens (the
    first ``take`` lengths at most: one ranged read of ``4 * take`` bytes or fewer)."""
    n = min(tokens.column("num_docs", shard), take)
    at = tokens.column("doclens_offset", shard)
    lens = np.frombuffer(tokens.read_range(shard, at, at + 4 * n), dtype="<u4").astype(np.int64)
    cut = int(np.searchsorted(np.cumsum(lens), take)) + 1
    return lens[:cut]


class BlockAccess:
    """Random access to the blocks of one token dataset: block ``i`` as
    :meth:`BlockTable.batches` gives it, by one ranged read of its tokens (two across a shard
    end) plus its shards' document lengths (one read a shard, the last 16 shards' kept).

    Args:
        tokens: the opened token dataset; seq_len: as :class:`TokenBlockUnit`.
    """

    def __init__(self, tokens: TokenIndex, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        self.num_blocks = block_count(tokens.num_tokens, seq_len)
        self._ends: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.num_blocks

    def _doc_ends(self, shard: int) -> np.ndarray:
        ends = self._ends.pop(shard, None)
        if ends is None:
            ends = int(self.tokens.token_starts[shard]) + np.cumsum(self.tokens.doclens(shard), dtype=np.int64)
        self._ends[shard] = ends
        while len(self._ends) > 16:
            self._ends.pop(next(iter(self._ends)))
        return ends

    def block(self, i: int) -> dict[str, Any]:
        """Block ``i`` (``-len <= i < len``): ``{"__key__": i, "__shard__": its first shard's
        URL, "tokens": (seq_len + 1,) on-disk dtype, "doc_lens": int32}``.

        Raises:
            IndexError: ``i`` out of range.
        """
        i = operator.index(i)  # an int, a numpy integer, a one-element tensor; the key is an int
        n = self.num_blocks
        if not -n <= i < n:
            raise IndexError(f"block {i} of {n} (seq_len={self.seq_len})")
        i %= n
        a = i * self.seq_len
        b = a + self.seq_len
        tokens = self.tokens.stream_tokens(a, b + 1)
        first, _ = self.tokens.locate(a)
        last, _ = self.tokens.locate(b - 1)
        ends = np.concatenate([self._doc_ends(s) for s in range(first, last + 1)])
        j, k = np.searchsorted(ends, [a, b], side="right")
        lens = np.diff(np.concatenate(([a], ends[j:k], [b]))).astype(np.int32)
        return {"__key__": i, "__shard__": self.tokens.shard_url(first), "tokens": tokens, "doc_lens": lens[lens > 0]}


@dataclass(frozen=True)
class TokenBlockUnit:
    """The item unit of token blocks (:class:`~shardstream.reading.stages.ItemUnit`): an item
    is a block of ``seq_len + 1`` tokens (module doc). Its name, recorded in checkpoints,
    holds ``seq_len``: a checkpoint resumes only at the same block length.

    Raises:
        ValueError: ``seq_len`` below 1; a dataset that is not of tokens (says what to run).
    """

    seq_len: int

    def __post_init__(self) -> None:
        if not isinstance(self.seq_len, int) or isinstance(self.seq_len, bool) or self.seq_len < 1:
            raise ValueError(f"seq_len={self.seq_len!r} must be an int >= 1 (tokens a block feeds the model)")

    @property
    def name(self) -> str:
        return f"token_block:{self.seq_len}"

    def items_of(self, shards: ShardSet) -> ShardSet:
        return BlockShards(token_index_of(shards, "token blocks"), self.seq_len)

    def stages(self) -> Sequence[Any]:
        return ()


def token_index_of(shards: ShardSet, what: str) -> TokenIndex:
    """The :class:`TokenIndex` of the token dataset ``shards`` reads, for an item unit's
    ``items_of`` (``what``: its items, as the error names them).

    Raises:
        ValueError: ``shards`` has no index (bare shard URLs).
    """
    index = getattr(shards, "index", None)
    if index is None:
        raise ValueError(
            f"{shards!r}: {what} read a token dataset by its index (a directory or prefix written by "
            "shardstream pack-text or import-tokens), not bare shard URLs"
        )
    return TokenIndex.of_index(index)


def blocks_of(tokens: TokenIndex, seq_len: int) -> int:
    """Blocks of ``seq_len`` in a token dataset (:func:`block_count` of its tokens)."""
    return block_count(tokens.num_tokens, seq_len)
