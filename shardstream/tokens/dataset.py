"""``TokenBlocks``: fixed-length token blocks of a token dataset (or a mixture of them) as a
torch dataset, and :func:`collate_blocks`, which gives a batch its ``cu_seqlens``.

It is a :class:`~shardstream.ShardDataset` whose item unit is the token block
(:class:`~.blocks.TokenBlockUnit`): epochs, ``len``, shuffling, per-rank and per-worker
pieces, checkpoints and elastic resume, mixtures, stores and the node cache are the reading
pipeline's own (docs/tokens.md); this module adds only the tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..config import FetchConfig, MixMode, OnError, RequestConfig, S3Config
from ..dataset import ShardDataset
from ..reading.mixture import Source
from .blocks import BlockAccess, TokenBlockUnit
from .docids import TokenIds
from .packed import PackedDocumentUnit

__all__ = ["BlockTensors", "PackedDocuments", "PackedTensors", "TokenBlocks", "collate_blocks"]

IGNORE_INDEX = -100  # what labels hold where no token is to be predicted (PyTorch's cross_entropy ignore_index)


class BlockTensors:
    """A block item (``tokens``, ``doc_lens``: :class:`~.blocks.BlockTable`) as tensors on the CPU:

    - ``input_ids``: int64 ``(seq_len,)``, the block's first ``seq_len`` tokens;
    - ``labels``: int64 ``(seq_len,)``, the next token of each (``input_ids`` shifted by one);
    - ``position_ids``: int64 ``(seq_len,)``, restarting at 0 where each document starts (and
      at the block's start);
    - ``doc_lens``: int32 ``(num_pieces,)``, the lengths of the document pieces among the
      inputs, from the stored boundaries (they add up to ``seq_len``);
    - ``__key__``: the block's number in its source's stream (int); a mixture's ``__source__``.
    """

    def __init__(self) -> None:
        self._arange = np.zeros(0, dtype=np.int64)

    def __call__(self, item: Mapping[str, Any]) -> dict[str, Any]:
        tokens = item["tokens"].astype(np.int64)
        lens = item["doc_lens"]
        n = len(tokens) - 1
        if len(self._arange) != n:
            self._arange = np.arange(n, dtype=np.int64)
        if len(lens) == 1:
            positions = self._arange.copy()
        else:  # slices of one arange joined: ~5 us a block, where cumsum and repeat took ~14
            positions = np.concatenate([self._arange[:n] for n in lens.tolist()])
        out = {
            "__key__": item["__key__"],
            "input_ids": torch.from_numpy(tokens[:-1]),
            "labels": torch.from_numpy(tokens[1:]),
            "position_ids": torch.from_numpy(positions),
            "doc_lens": torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int32)),
        }
        if "__source__" in item:
            out["__source__"] = item["__source__"]
        return out


class PackedTensors:
    """A packed bin (:mod:`.packed`: whole documents, at most ``seq_len`` tokens) as tensors
    on the CPU, padded to ``seq_len``:

    - ``input_ids``: int64 ``(seq_len,)``, the bin's documents, then ``pad_id``;
    - ``labels``: int64 ``(seq_len,)``, each token's next token *within its document*;
      ``-100`` at each document's last token and over the padding (never a token of another
      document, never padding);
    - ``position_ids``: int64 ``(seq_len,)``, from 0 at each document (and at the padding);
    - ``doc_lens``: int32, the documents' lengths, then the padding's (they add up to ``seq_len``);
    - ``__key__``: the bin's number in its source.
    """

    def __init__(self, seq_len: int, pad_id: int = 0) -> None:
        self.seq_len, self.pad_id = seq_len, pad_id

    def __call__(self, item: Mapping[str, Any]) -> dict[str, Any]:
        tokens, lens = item["tokens"].astype(np.int64), item["doc_lens"]
        n, size = len(tokens), self.seq_len
        input_ids = np.full(size, self.pad_id, dtype=np.int64)
        input_ids[:n] = tokens
        labels = np.full(size, IGNORE_INDEX, dtype=np.int64)
        labels[: n - 1] = tokens[1:]
        labels[np.cumsum(lens) - 1] = IGNORE_INDEX
        if n < size:
            lens = np.append(lens, size - n).astype(np.int32)
        positions = np.arange(size, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        out = {
            "__key__": item["__key__"],
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(positions),
            "doc_lens": torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int32)),
        }
        if "__source__" in item:
            out["__source__"] = item["__source__"]
        return out


def collate_blocks(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A batch of blocks (:class:`BlockTensors`) as variable-length attention takes it:

    - ``input_ids``, ``labels``, ``position_ids``: int64 ``(batch, seq_len)``;
    - ``cu_seqlens``: int32 ``(num_pieces + 1,)``, the cumulative lengths of the document
      pieces of the batch flattened to ``batch * seq_len`` tokens, from 0 (flash-attention's
      ``flash_attn_varlen_func`` ``cu_seqlens_q``/``_k``; PyTorch document masks);
    - ``max_seqlen``: int, the longest piece;
    - ``doc_lens``: int32 ``(num_pieces,)``; ``keys``: the blocks' numbers (a list).

    All on the CPU (a DataLoader's ``pin_memory`` pins them).

    Raises:
        ValueError: no items, or blocks of different lengths.
    """
    if not items:
        raise ValueError("collate_blocks needs at least one block")
    lengths = {len(it["input_ids"]) for it in items}
    if len(lengths) != 1:
        raise ValueError(f"blocks of different seq_len in one batch: {sorted(lengths)}")
    lens = torch.cat([it["doc_lens"] for it in items])
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    torch.cumsum(lens, 0, out=cu[1:])
    out = {
        "input_ids": torch.stack([it["input_ids"] for it in items]),
        "labels": torch.stack([it["labels"] for it in items]),
        "position_ids": torch.stack([it["position_ids"] for it in items]),
        "cu_seqlens": cu,
        "max_seqlen": int(lens.max()),
        "doc_lens": lens,
        "keys": [it["__key__"] for it in items],
    }
    if "__source__" in items[0]:
        out["sources"] = [it["__source__"] for it in items]
    return out


class TokenBlocks(ShardDataset):
    """Fixed-length token blocks of a token dataset, cut across documents and shard ends
    (:mod:`shardstream.tokens.blocks`: the block rule, the last partial block), with their
    document boundaries, as a torch ``IterableDataset``.

    Args:
        source: a token dataset (``shardstream pack-text`` / ``import-tokens``: a directory,
            an ``s3://`` or other store prefix), or a list of ``Source(...)`` of them: a
            mixture, whose ``weight=`` / ``samples=`` count blocks, that is tokens.
        seq_len: tokens a block feeds the model (each block holds ``seq_len + 1``).
        shuffle, seed, shuffle_buffer, max_open_shards: the epoch's order: shards (windows of
            contiguous blocks) in a seeded order each epoch, blocks through a shuffle buffer
            of ``shuffle_buffer`` blocks.
        batch_size: the DataLoader's (workers' pieces are cut into whole batches); with
            ``collate=collate_blocks`` the dataset makes the batches (read it with
            ``DataLoader(dataset, batch_size=None)``).
        drop_last: ranks get ``floor(blocks / world_size)`` blocks (the rest dropped) instead of
            ``ceil`` (the last ones padded with blocks from the epoch's start).
        epoch_blocks: a mixture's blocks an epoch (``ShardDataset(epoch_samples=)``).
        Other arguments: as :class:`~shardstream.ShardDataset`.

    Yields:
        dicts of CPU tensors (:class:`BlockTensors`), or with ``collate`` its batches.

    Raises:
        ValueError: ``seq_len`` below 1, a dataset that is not of tokens, or a bad argument.
        ShardNotFoundError, IndexFormatError: no or a bad index.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Source | Sequence[Source],
        *,
        seq_len: int,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        batch_size: int | None = None,
        drop_last: bool = False,
        max_open_shards: int = 4,
        epoch_blocks: int | None = None,
        mix: MixMode = "stratified",
        collate: Any = None,
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        fetch: FetchConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        log_every_s: float | None = None,
        on_error: OnError = "raise",
        verify_checksums: bool = False,
        replication: int = 1,
    ) -> None:
        if epoch_blocks is not None and not (
            isinstance(source, Sequence) and not isinstance(source, str) and all(isinstance(s, Source) for s in source)
        ):
            raise ValueError(
                f"epoch_blocks={epoch_blocks} sets the size of a mixture's epoch; give a list of Source(...) "
                "or leave it out (one dataset's epoch is all its blocks)"
            )
        super().__init__(
            source,
            unit=self._unit(seq_len),
            decode=self._tensors(seq_len),
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            batch_size=batch_size,
            drop_last=drop_last,
            max_open_shards=max_open_shards,
            epoch_samples=epoch_blocks,
            mix=mix,
            collate=collate,
            s3=s3,
            requests=requests,
            fetch=fetch,
            cache_dir=cache_dir,
            cache_limit_bytes=cache_limit_bytes,
            log_every_s=log_every_s,
            on_error=on_error,
            verify_checksums=verify_checksums,
            replication=replication,
        )
        self.seq_len = seq_len
        self._decode = BlockTensors()

    def _unit(self, seq_len: int) -> Any:
        return TokenBlockUnit(seq_len)

    def _tensors(self, seq_len: int) -> Any:
        return BlockTensors()

    def __getitem__(self, i: int | slice) -> Any:
        """Block ``i`` of a token dataset (not a mixture), as iteration yields it
        (:class:`BlockTensors`): one ranged read of its tokens, two across a shard end, and
        its shard's document lengths (:class:`~.blocks.BlockAccess`); a slice gives a list.

        Raises:
            IndexError: ``i`` out of range. TypeError: a mixture (open each source instead).
        """
        access = self.__dict__.get("_blocks")
        if access is None:
            if self.index is None:
                raise TypeError(f"{self!r}: random access reads one token dataset; open each source on its own")
            access = self.__dict__["_blocks"] = BlockAccess(self.reader.engines[0].shards.tokens, self.seq_len)
        if isinstance(i, slice):
            return [self._decode(access.block(j)) for j in range(*i.indices(len(access)))]
        return self._decode(access.block(i))

    def get(self, key: str) -> torch.Tensor:
        """The tokens of the document whose id is ``key`` (int64 ``(length,)``, the end token
        included), by the dataset's ``docids/`` index (:class:`~.docids.TokenIds`: one small
        ranged read, then the document's). Not for a mixture.

        Raises:
            KeyError: no such document. ShardNotFoundError: no ``docids/`` (says how to build it).
            TypeError: a mixture.
        """
        ids = self.__dict__.get("_ids")
        if ids is None:
            if self.index is None:
                raise TypeError(f"{self!r}: documents are looked up in one token dataset; open each source")
            ids = self.__dict__["_ids"] = TokenIds.open(self.reader.engines[0].shards.tokens)
        return torch.from_numpy(ids.get(key).astype(np.int64))

    def get_many(self, indices_or_keys: Sequence[int | str] | range) -> list[Any]:
        """Blocks by number, documents by id (:meth:`__getitem__`, :meth:`get`), in order."""
        return [self.get(k) if isinstance(k, str) else self[k] for k in indices_or_keys]

    def __repr__(self) -> str:
        return f"TokenBlocks({self.num_shards} shards, seq_len={self.seq_len}, num_blocks={self.num_samples})"


class PackedDocuments(TokenBlocks):
    """Documents packed whole into blocks of ``seq_len`` tokens, for fine-tuning data: best-fit
    over windows of ``window`` documents (:mod:`shardstream.tokens.packed`: the rule, the one
    cut it makes), the rest of each block padded with ``pad_id`` and masked in the labels
    (:class:`PackedTensors`). An item is a bin: epochs, ``len``, ranks, checkpoints and
    mixtures count bins, every document read once an epoch. Opening reads every shard's
    document lengths (O(documents), once a process).

    Args:
        pad_id: the token id padding takes (masked: never a label).
        window: documents packed together (larger packs tighter, holds more in memory).
        Other arguments: as :class:`TokenBlocks`.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Source | Sequence[Source],
        *,
        seq_len: int,
        pad_id: int = 0,
        window: int = 1000,
        **kwargs: Any,
    ) -> None:
        self.pad_id, self.window = pad_id, window
        super().__init__(source, seq_len=seq_len, **kwargs)

    def _unit(self, seq_len: int) -> Any:
        return PackedDocumentUnit(seq_len, self.window)

    def _tensors(self, seq_len: int) -> Any:
        return PackedTensors(seq_len, self.pad_id)

    def __getitem__(self, i: int | slice) -> Any:
        raise TypeError(f"{self!r}: packed bins are read in epochs, not by index; TokenBlocks reads blocks by index")

    def __repr__(self) -> str:
        return f"PackedDocuments({self.num_shards} shards, seq_len={self.seq_len}, num_bins={self.num_samples})"
