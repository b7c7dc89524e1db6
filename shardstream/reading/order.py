"""The order of an exact epoch's shards (:mod:`.plan`, step 1): :class:`ShardOrder`, the
seeded permutation and its cumulative counts, and under node affinity :class:`NodeLayout`,
the nodes' fixed shares of the shards. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["NodeLayout", "ShardOrder"]


@dataclass(frozen=True)
class NodeLayout:
    """How node affinity splits a job: ``num_nodes`` nodes of ``ranks_per_node`` ranks each
    (ranks ``n * ranks_per_node ..`` on node ``n``, as torchrun numbers them), each rank taking
    ``per_rank`` samples an epoch (:func:`per_rank`). Node ``n``'s share is positions
    ``n * node_samples ..`` of the epoch's sequence."""

    num_nodes: int
    ranks_per_node: int
    per_rank: int

    @property
    def node_samples(self) -> int:
        return self.ranks_per_node * self.per_rank


_AFFINITY_STREAM = 0x5A4E  # seeds the fixed split of shards over nodes, apart from any epoch's


@dataclass(frozen=True)
class ShardOrder:
    """One epoch's order of shards: the part of a plan that costs O(shards) and is the same
    for every rank and worker. A dataset keeps the latest ones, so DataLoader workers forked
    after ``set_epoch`` or ``len()`` inherit it instead of each computing its own copy.

    With node affinity (``nodes``) the sequence is made of *pieces*: the shards in an order
    fixed by ``seed`` alone are cut into the nodes' shares at the node boundaries (a shard
    that straddles one is split in two, so at most ``num_nodes - 1`` shards are read by two
    nodes), and each epoch shuffles the pieces within each node. So every node reads the
    same samples in every epoch, in a new order.

    Attributes (numpy, CPU):
        starts: int64 ``(shards + 1,)``: the first sample id of each shard, in index order.
        order: int32 ``(pieces,)``: the shard of each piece, in the epoch's order (without
            node affinity a piece is a whole shard and there are ``shards`` of them).
        order_starts: int64 ``(pieces + 1,)``: where each piece of ``order`` begins in the
            epoch's sequence.
        offsets: int64 ``(pieces,)``: each piece's first sample in its shard; None: all 0.
        wrap_from: where padding wraps to in the sequence (0; with node affinity, the start
            of the last node's share, so its padding repeats its own samples).
    """

    starts: np.ndarray
    order: np.ndarray
    order_starts: np.ndarray
    offsets: np.ndarray | None = None
    wrap_from: int = 0

    @classmethod
    def make(
        cls,
        counts: Sequence[int],
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        starts: np.ndarray | None = None,
        nodes: NodeLayout | None = None,
    ) -> ShardOrder:
        """The order of ``counts``' shards in ``epoch`` (permuted by ``(seed, epoch)`` when
        ``shuffle``); ``starts``: the cumulative counts, when already known; ``nodes``: node
        affinity's layout (class doc). O(shards)."""
        counts = np.asarray(counts, dtype=np.int64)
        if starts is None:
            starts = np.concatenate([[0], np.cumsum(counts)])
        shards = np.arange(len(counts), dtype=np.int32)  # int32: a million shards shuffle faster
        if nodes is not None:
            return cls._by_node(counts, starts, shards, seed=seed, epoch=epoch, shuffle=shuffle, nodes=nodes)
        order = np.random.default_rng([seed, epoch]).permutation(shards) if shuffle else shards
        return cls(starts, order, np.concatenate([[0], np.cumsum(counts[order])]))

    @classmethod
    def _by_node(
        cls,
        counts: np.ndarray,
        starts: np.ndarray,
        shards: np.ndarray,
        *,
        seed: int,
        epoch: int,
        shuffle: bool,
        nodes: NodeLayout,
    ) -> ShardOrder:
        total = int(starts[-1])
        base = np.random.default_rng([seed, _AFFINITY_STREAM]).permutation(shards) if shuffle else shards
        base_starts = np.concatenate([[0], np.cumsum(counts[base])])
        cuts = np.minimum(np.arange(1, nodes.num_nodes, dtype=np.int64) * nodes.node_samples, total)
        begins = base_starts[:-1]  # sorted: the cuts go in where they fall (no sort of 10^6 shards)
        begins = np.insert(begins, np.searchsorted(begins, cuts), cuts)
        distinct = np.ones(len(begins), bool)  # empty shards and cuts on a shard's start begin nothing new
        distinct[:-1] = begins[1:] != begins[:-1]
        begins = begins[distinct & (begins < total)]
        lengths = np.diff(np.concatenate([begins, [total]]))
        at = np.searchsorted(base_starts, begins, side="right") - 1  # the base shard each piece is of
        node = np.searchsorted(cuts, begins, side="right")  # going up, as the pieces do
        if shuffle:
            keys = np.random.default_rng([seed, epoch, _AFFINITY_STREAM]).random(len(begins))
            perm = np.argsort(node + keys)  # by node, then at random within it
        else:
            perm = np.arange(len(begins))
        last = int(cuts[-1]) if len(cuts) else 0
        return cls(
            starts,
            base[at[perm]],
            np.concatenate([[0], np.cumsum(lengths[perm])]),
            (begins - base_starts[at])[perm],
            last if last < total else 0,
        )
