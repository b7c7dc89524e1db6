"""Token datasets for the token-block tests, and their oracle.

:func:`make_docs` draws random documents (numpy, seeded): bodies of 0..~400 tokens in
``1 .. vocab_size - 1`` with the end-of-document token :data:`EOD` (0) appended, so some
documents are the EOD token alone; :func:`write_tokens` writes them with shardstream's
:class:`~shardstream.tokens.writer.TokenDatasetWriter` in small shards, some of them a
single one-token document (so a block crosses several shard ends). The oracle
(:class:`TokenData`) is the documents concatenated by numpy and their lengths, never read
back through shardstream; its methods give what block ``k`` must hold by the block rule
(``shardstream/tokens/blocks.py``): inputs ``kL .. kL+L``, labels one further, the pieces of
documents among the inputs, positions restarting at each document start and at the block start.

Tests import it as they import ``resume_check``: ``from token_fixtures import ...``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EOD", "TokenData", "check_batch", "check_epoch", "check_item", "make_docs", "write_tokens"]

EOD = 0


def make_docs(num_docs: int, *, vocab_size: int, seed: int, max_len: int = 400) -> list[np.ndarray]:
    """``num_docs`` documents, each int64 tokens ending with :data:`EOD`: lengths 1..``max_len``
    (every 9th document is the EOD token alone, length 1), body tokens uniform in
    ``1 .. vocab_size - 1`` (so a vocabulary above 65,536 has ids that need 32 bits)."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(num_docs):
        n = 0 if i % 9 == 4 else int(rng.integers(0, max_len))
        docs.append(np.append(rng.integers(1, vocab_size, n), EOD).astype(np.int64))
    return docs


@dataclass
class TokenData:
    """A token dataset as written, and its oracle.

    Attributes:
        path: the dataset's directory (or prefix).
        tokens: int64, every document's tokens one after another (numpy's concatenation).
        doc_lens: int64, each document's length (its EOD included).
        num_shards: shards the writer wrote; shard_tokens: tokens of each.
        vocab_size: as written (decides the on-disk dtype).
    """

    path: Any
    tokens: np.ndarray
    doc_lens: np.ndarray
    num_shards: int
    shard_tokens: list[int]
    vocab_size: int
    _doc_of: np.ndarray = field(init=False, repr=False)
    _doc_start: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        starts = np.cumsum(self.doc_lens) - self.doc_lens
        self._doc_of = np.repeat(np.arange(len(self.doc_lens)), self.doc_lens)  # the document of each token
        self._doc_start = np.repeat(starts, self.doc_lens)  # where each token's document starts
        assert len(self._doc_of) == len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def shard_ends(self) -> np.ndarray:
        """Stream positions where shards end (exclusive)."""
        return np.cumsum(self.shard_tokens)

    def num_blocks(self, seq_len: int) -> int:
        """B = (N - 1) // L: the tail that makes no whole block is dropped."""
        return max(0, (self.num_tokens - 1) // seq_len)

    def input_ids(self, k: int, seq_len: int) -> np.ndarray:
        return self.tokens[k * seq_len : k * seq_len + seq_len]

    def labels(self, k: int, seq_len: int) -> np.ndarray:
        return self.tokens[k * seq_len + 1 : k * seq_len + seq_len + 1]

    def doc_pieces(self, k: int, seq_len: int) -> np.ndarray:
        """The lengths of the runs of one document among block ``k``'s inputs."""
        docs = self._doc_of[k * seq_len : k * seq_len + seq_len]
        cuts = np.flatnonzero(np.diff(docs)) + 1
        return np.diff(np.concatenate(([0], cuts, [len(docs)])))

    def positions(self, k: int, seq_len: int) -> np.ndarray:
        """Each input's position: tokens since its document's start or the block's, whichever is later."""
        a = k * seq_len
        at = np.arange(a, a + seq_len)
        return at - np.maximum(self._doc_start[a : a + seq_len], a)

    def epoch(self, seq_len: int) -> dict[str, np.ndarray]:
        """The whole epoch by the oracle, blocks in order: ``input_ids``, ``labels``,
        ``position_ids`` ``(B, L)``; ``pieces``: every block's document pieces one after
        another, ``piece_counts``: how many each block has."""
        n = self.num_blocks(seq_len) * seq_len
        at = np.arange(n)
        block_start = at - at % seq_len
        first = (at == block_start) | np.concatenate(([True], self._doc_of[1:n] != self._doc_of[: n - 1]))
        starts = np.flatnonzero(first)
        return {
            "input_ids": self.tokens[:n].reshape(-1, seq_len),
            "labels": self.tokens[1 : n + 1].reshape(-1, seq_len),
            "position_ids": (at - np.maximum(self._doc_start[:n], block_start)).reshape(-1, seq_len),
            "pieces": np.diff(np.append(starts, n)),
            "piece_counts": np.bincount(starts // seq_len, minlength=n // seq_len),
        }

    def crosses_shard_ends(self, k: int, seq_len: int) -> int:
        """How many shard ends lie strictly inside block ``k``'s ``L + 1`` tokens."""
        a = k * seq_len
        ends = self.shard_ends
        return int(((ends > a) & (ends < a + seq_len + 1)).sum())


def write_tokens(
    dest: str | os.PathLike[str] | Path,
    docs: Sequence[np.ndarray],
    *,
    vocab_size: int,
    max_shard_tokens: int,
    alone: Sequence[int] = (),
    docs_per_shard: int | None = None,
    **writer_options: Any,
) -> TokenData:
    """Write ``docs`` (ids ``d0``, ``d1``, ...) as a token dataset at ``dest`` with
    ``TokenDatasetWriter(max_shard_tokens=)``; each document whose number is in ``alone`` gets
    a shard of its own; ``docs_per_shard``: a shard ends after every so many documents too.
    Returns the dataset and its oracle (from ``docs``, not read back)."""
    from shardstream.tokens.writer import TokenDatasetWriter

    alone = set(alone)
    with TokenDatasetWriter(
        dest, vocab_size=vocab_size, eod_id=EOD, max_shard_tokens=max_shard_tokens, **writer_options
    ) as writer:
        for i, doc in enumerate(docs):
            if i in alone:
                writer.flush()
            writer.add(doc, f"d{i}")
            if i in alone or (docs_per_shard and (i + 1) % docs_per_shard == 0):
                writer.flush()
    shard_tokens = [row.num_tokens for row in writer.rows]
    assert sum(shard_tokens) == sum(len(d) for d in docs)
    return TokenData(
        path=dest,
        tokens=np.concatenate(docs).astype(np.int64),
        doc_lens=np.array([len(d) for d in docs], dtype=np.int64),
        num_shards=len(writer.names),
        shard_tokens=shard_tokens,
        vocab_size=vocab_size,
    )


def check_item(data: TokenData, item: Mapping[str, Any], seq_len: int) -> int:
    """Assert that ``item`` (one block as TokenBlocks yields it) is block ``item["__key__"]``
    of ``data`` by the oracle; returns its number."""
    import torch

    k = item["__key__"]
    assert isinstance(k, int) and 0 <= k < data.num_blocks(seq_len), k
    for name in ("input_ids", "labels", "position_ids"):
        assert item[name].dtype == torch.int64 and item[name].shape == (seq_len,), (name, item[name].shape)
    assert item["doc_lens"].dtype == torch.int32
    np.testing.assert_array_equal(item["input_ids"].numpy(), data.input_ids(k, seq_len), err_msg=f"block {k}")
    np.testing.assert_array_equal(item["labels"].numpy(), data.labels(k, seq_len), err_msg=f"block {k}")
    np.testing.assert_array_equal(item["doc_lens"].numpy(), data.doc_pieces(k, seq_len), err_msg=f"block {k}")
    np.testing.assert_array_equal(item["position_ids"].numpy(), data.positions(k, seq_len), err_msg=f"block {k}")
    return k


def check_epoch(data: TokenData, items: Sequence[Mapping[str, Any]], seq_len: int) -> list[int]:
    """Assert that ``items`` (blocks as TokenBlocks yields them, in any order) are exactly the
    epoch's blocks, each once, each as the oracle says (vectorised :func:`check_item`);
    returns their numbers in the order given."""
    import torch

    keys = [item["__key__"] for item in items]
    num_blocks = data.num_blocks(seq_len)
    assert sorted(keys) == list(range(num_blocks)), (len(keys), num_blocks)
    order = sorted(range(len(items)), key=keys.__getitem__)
    want = data.epoch(seq_len)
    for name in ("input_ids", "labels", "position_ids"):
        assert all(items[i][name].dtype == torch.int64 for i in order), name
        got = torch.stack([items[i][name] for i in order]).numpy() if items else np.zeros((0, seq_len))
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    lens = [items[i]["doc_lens"] for i in order]
    assert all(x.dtype == torch.int32 for x in lens)
    np.testing.assert_array_equal([len(x) for x in lens], want["piece_counts"], err_msg="pieces per block")
    if lens:
        np.testing.assert_array_equal(torch.cat(lens).numpy(), want["pieces"], err_msg="doc_lens")
    return keys


def check_batch(data: TokenData, batch: Mapping[str, Any], seq_len: int) -> list[int]:
    """Assert that ``batch`` (``collate_blocks`` of blocks of ``data``) holds the blocks its
    ``keys`` name, by the oracle, with a right ``cu_seqlens`` and ``max_seqlen``; returns the keys."""
    import torch

    keys = list(batch["keys"])
    n = len(keys)
    for name in ("input_ids", "labels", "position_ids"):
        assert batch[name].dtype == torch.int64 and batch[name].shape == (n, seq_len), (name, batch[name].shape)
    pieces = [data.doc_pieces(k, seq_len) for k in keys]
    for row, k in enumerate(keys):
        np.testing.assert_array_equal(batch["input_ids"][row].numpy(), data.input_ids(k, seq_len))
        np.testing.assert_array_equal(batch["labels"][row].numpy(), data.labels(k, seq_len))
        np.testing.assert_array_equal(batch["position_ids"][row].numpy(), data.positions(k, seq_len))
    lens = np.concatenate(pieces)
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.ndim == 1
    np.testing.assert_array_equal(batch["doc_lens"].numpy(), lens)
    assert batch["doc_lens"].dtype == torch.int32
    np.testing.assert_array_equal(cu.numpy(), np.concatenate(([0], np.cumsum(lens))))
    assert int(cu[0]) == 0 and int(cu[-1]) == n * seq_len
    assert batch["max_seqlen"] == int(lens.max()) and isinstance(batch["max_seqlen"], int)
    return keys
