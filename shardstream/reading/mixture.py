"""Mixtures: several datasets read at set proportions, every epoch exact and known in advance.
No torch. The rules are on the docs' "Mixtures" page (``docs/mixtures.md``); in short:

1. **Counts** (:func:`epoch_counts`). Each :class:`Source` reads a number of samples per
   epoch: ``samples=N``; ``repeat=r`` (``r`` times its size); or ``weight=w`` (its share of
   what ``epoch_samples`` leaves after the others). Fractional quotas become integers by the
   largest remainder (ties to the earlier source), so they sum exactly to the epoch size.
2. **Coverage** (:class:`Coverage`, :func:`selection`). A source reading ``n = q * N + m``
   samples of its ``N`` (``0 <= m < N``) reads each sample ``q`` times and ``m`` more from its
   *coverage stream*: cycle after cycle of seeded permutations of its shards (samples in shard
   order), each epoch taking the next ``m``. So a sub-sampled source reads no sample twice
   before it has read them all, and a repeated one no sample more than ``ceil(r)`` times in an
   epoch: where an epoch's ``m`` runs from one cycle into the next, the next cycle puts the
   shards read in that epoch last.
3. **Interleaving** (:func:`apportion`, :func:`window_labels`). Rounds of positions (ranks,
   then each rank's batches) are shared out among sources so that each round holds the floor
   or ceil of each source's share and the running totals stay within one of the ideal; within
   a round, the ``k``-th of a source's ``c`` samples goes at time ``(k + 1/2) / c``.

All of it is O(shards) per source and O(batches) per rank: no list of samples.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = [
    "Coverage",
    "Selection",
    "Source",
    "apportion",
    "apportion_prefix",
    "epoch_counts",
    "selection",
    "sources_of",
    "window_labels",
]


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture and how much of it each epoch reads.

    Args:
        location: a dataset written by ``shardstream pack`` or indexed by ``shardstream
            index`` (local directory, ``s3://bucket/prefix``, or its index file): a mixture
            needs every source's sample counts.
        weight: its share of ``ShardDataset(epoch_samples=)`` (of what ``samples=`` and
            ``repeat=`` sources leave), relative to the other weights; >= 0.
        repeat: samples per epoch as a multiple of the source's size (0.1: a tenth of it,
            2.0: all of it twice); > 0.
        samples: samples per epoch, absolute; >= 1.
        name: the source's name in ``stats()``, errors and each sample's ``"__source__"``;
            default its location.

    At most one of ``weight``, ``repeat`` and ``samples``; none means ``repeat=1.0`` (the
    whole source once per epoch).

    Raises:
        ValueError: two of them given, or one out of range (naming the source).
    """

    location: str | os.PathLike[str] | Sequence[str]
    weight: float | None = None
    repeat: float | None = None
    samples: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("weight", "repeat", "samples") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"Source {self.label!r}: give one of weight=, repeat=, samples= (got {', '.join(given)})")
        if self.weight is not None and not (isinstance(self.weight, (int, float)) and 0 <= self.weight < math.inf):
            raise ValueError(f"Source {self.label!r}: weight={self.weight!r} must be a finite number >= 0")
        if self.repeat is not None and not (isinstance(self.repeat, (int, float)) and 0 < self.repeat < math.inf):
            raise ValueError(f"Source {self.label!r}: repeat={self.repeat!r} must be a finite number > 0")
        if self.samples is not None and (
            not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 1
        ):
            raise ValueError(f"Source {self.label!r}: samples={self.samples!r} must be an int >= 1")

    @property
    def label(self) -> str:
        """The source's name: ``name``, else its location."""
        if self.name is not None:
            return self.name
        if isinstance(self.location, (str, os.PathLike)):
            return os.fspath(self.location)
        urls = list(self.location)
        return f"{urls[0]} (+{len(urls) - 1} shards)" if urls else "[]"

    def rule(self) -> dict[str, Any]:
        """How its per-epoch count is set, as checkpoints record it."""
        if self.weight is not None:
            return {"weight": float(self.weight)}
        if self.samples is not None:
            return {"samples": int(self.samples)}
        return {"repeat": float(self.repeat if self.repeat is not None else 1.0)}


def sources_of(source: Any) -> list[Source] | None:
    """The mixture ``source`` names (a Source, or a list of them), or None (one dataset).

    Raises:
        TypeError: a list mixing Source objects and shard URLs.
    """
    if isinstance(source, Source):
        return [source]
    if isinstance(source, (list, tuple)) and any(isinstance(x, Source) for x in source):
        if not all(isinstance(x, Source) for x in source):
            raise TypeError("a list of Source(...) mixes datasets; give every entry as Source(location, ...)")
        return list(source)
    return None


def epoch_counts(sources: Sequence[Source], sizes: Sequence[int], epoch_samples: int | None) -> list[int]:
    """Samples each source reads per epoch (module doc, rule 1).

    Args:
        sources: the mixture.
        sizes: each source's samples (from its index).
        epoch_samples: the epoch's size; needed when a source has ``weight=``; without weights,
            None or the sources' own sum.

    Returns:
        one int per source, summing to the epoch size.

    Raises:
        ValueError: an empty source, weights without ``epoch_samples`` or summing to 0, an
            ``epoch_samples`` the fixed sources exceed or (without weights) differ from; each
            message names the sources concerned.
    """
    if not sources:
        raise ValueError("a mixture needs at least one Source")
    for src, size in zip(sources, sizes):
        if size <= 0:
            raise ValueError(f"Source {src.label!r} holds no samples; remove it from the mixture or pack data into it")
    if epoch_samples is not None and (not isinstance(epoch_samples, int) or epoch_samples < 1):
        raise ValueError(f"{epoch_samples=} must be an int >= 1 or None")
    fixed = sum(src.samples for src in sources if src.samples is not None)
    quotas: dict[int, Fraction] = {}
    for i, (src, size) in enumerate(zip(sources, sizes)):
        if src.samples is None and src.weight is None:
            quotas[i] = Fraction(src.repeat if src.repeat is not None else 1.0) * size
    weights = {i: src.weight for i, src in enumerate(sources) if src.weight is not None}
    names = ", ".join(repr(sources[i].label) for i in weights)
    if weights:
        if epoch_samples is None:
            raise ValueError(
                f"the weight= sources {names} need ShardDataset(epoch_samples=...): their weights share it out"
            )
        total_weight = sum((Fraction(weight) for weight in weights.values()), Fraction(0))
        if total_weight <= 0:
            raise ValueError(f"the weights of {names} sum to {float(total_weight)}; they must sum to a positive number")
        left = epoch_samples - fixed - sum(quotas.values(), Fraction(0))
        if left <= 0:
            raise ValueError(
                f"epoch_samples={epoch_samples} leaves {float(left):g} samples for the weight= sources {names} after "
                f"the samples= and repeat= sources take {float(epoch_samples - left):g}; raise epoch_samples or lower "
                "those"
            )
        for i, weight in weights.items():
            quotas[i] = left * Fraction(weight) / total_weight
        total = epoch_samples
    else:
        exact = fixed + sum(quotas.values(), Fraction(0))
        total = math.floor(exact + Fraction(1, 2))
        if epoch_samples is not None and epoch_samples != total:
            raise ValueError(
                f"epoch_samples={epoch_samples} but the sources add up to {float(exact):g} samples and none has "
                "weight=; leave epoch_samples out, or give some sources weight= to share it"
            )
    counts = [src.samples if src.samples is not None else math.floor(quotas[i]) for i, src in enumerate(sources)]
    short = total - sum(counts)
    by_remainder = sorted(quotas, key=lambda i: (-(quotas[i] - math.floor(quotas[i])), i))
    for i in by_remainder[:short]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class CoverageBase:
    """Where a source's coverage stream stands at the start of ``epoch``: ``position`` samples
    read from it, and the cut of each cycle closed before (module doc, rule 2)."""

    epoch: int = 0
    position: int = 0
    cuts: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "cuts": list(self.cuts)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CoverageBase:
        return cls(int(d["epoch"]), int(d["position"]), tuple(int(x) for x in d.get("cuts", ())))


class Coverage:
    """One source's coverage stream: cycle ``c`` is a seeded permutation of its shards, and an
    epoch reads the next ``per_epoch`` samples of it (module doc, rule 2).

    Args:
        counts: samples per shard of the source (int64).
        per_epoch: samples read from the stream each epoch (``n mod N``).
        seed, source: seed of the permutations, and the source's place in the mixture.
        shuffle: permute; False: index order in every cycle.
        base: where the stream stands at an epoch (a checkpoint's, after a change of mixture).
    """

    def __init__(
        self, counts: np.ndarray, *, per_epoch: int, seed: int, source: int, shuffle: bool, base: CoverageBase
    ) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.size = int(self.counts.sum())
        self.per_epoch = per_epoch
        self.seed = seed
        self.source = source
        self.shuffle = shuffle
        self.base = base
        self._cycle: tuple[int, np.ndarray] | None = None  # the latest cycle order computed

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cycle"] = None
        return state

    def position(self, epoch: int) -> int:
        """Samples of the stream read before ``epoch``."""
        return self.base.position + (epoch - self.base.epoch) * self.per_epoch

    def cut(self, cycle: int) -> int:
        """Where, in ``cycle``'s order, the epoch that also begins the next cycle started
        (``size``: no epoch spans the two)."""
        if cycle < len(self.base.cuts):
            return self.base.cuts[cycle]
        end = (cycle + 1) * self.size
        if self.per_epoch == 0:
            return self.size
        steps, rest = divmod(end - self.base.position, self.per_epoch)
        if rest == 0:
            return self.size
        return self.base.position + steps * self.per_epoch - cycle * self.size

    def cuts_before(self, epoch: int) -> tuple[int, ...]:
        """The cuts of every cycle closed before ``epoch`` starts."""
        return tuple(self.cut(c) for c in range(self.position(epoch) // self.size))

    def cycle_order(self, cycle: int) -> np.ndarray:
        """int32 ``(shards,)``: shard ids in ``cycle``'s order. Cycle ``c + 1`` is its own seeded
        permutation, stably reordered so that the shards cycle ``c`` read in the epoch that
        spans both come last (the one cut in two between them). O(shards) per cycle since the
        last one computed."""
        first, order = self._cycle if self._cycle is not None and self._cycle[0] <= cycle else (0, self._permutation(0))
        for c in range(first + 1, cycle + 1):
            cut = self.cut(c - 1)
            perm = self._permutation(c)
            if cut < self.size:
                begins = np.empty(len(order), np.int64)
                begins[order] = np.concatenate([[0], np.cumsum(self.counts[order])[:-1]])
                ends = begins + self.counts
                group = np.where(ends <= cut, 0, np.where(begins < cut, 1, 2)).astype(np.int8)
                perm = perm[np.argsort(group[perm], kind="stable")]
            order = perm
        self._cycle = (cycle, order)
        return order

    def _permutation(self, cycle: int) -> np.ndarray:
        shards = np.arange(len(self.counts), dtype=np.int32)
        if not self.shuffle:
            return shards
        return np.random.default_rng([self.seed, self.source, cycle, 7]).permutation(shards)

    def entries(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The stream's part read in ``epoch``: ``(shard, lo, count)`` arrays, runs of shards in
        stream order."""
        start = self.position(epoch)
        stop = start + self.per_epoch
        parts = []
        while start < stop:
            cycle, offset = divmod(start, self.size)
            take = min(stop - start, self.size - offset)
            parts.append(_range_entries(self.cycle_order(cycle), self.counts, offset, offset + take))
            start += take
        if not parts:
            return np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64)
        shards, los, counts = zip(*parts)  # each part's (shard, lo, count)
        return np.concatenate(shards), np.concatenate(los), np.concatenate(counts)


def _range_entries(order: np.ndarray, counts: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(shard, lo, count)`` of positions ``a..b-1`` of the samples of ``order``'s shards."""
    starts = np.concatenate([[0], np.cumsum(counts[order])])
    first = int(np.searchsorted(starts, a, side="right")) - 1
    last = int(np.searchsorted(starts, b - 1, side="right")) - 1
    shard = order[first : last + 1]
    begin = starts[first : last + 1]
    lo = np.maximum(begin, a) - begin
    hi = np.minimum(starts[first + 1 : last + 2], b) - begin
    keep = hi > lo
    return shard[keep].astype(np.int32), lo[keep].astype(np.int64), (hi - lo)[keep].astype(np.int64)


@dataclass
class Selection:
    """One source's samples of one epoch, in the epoch's order, as *virtual shards*: piece
    ``v`` is samples ``lo[v] .. lo[v] + count - 1`` of real shard ``shard[v]``. A sample of the
    selection is named by its position (its *virtual id*): unique even where a repeated source
    reads a sample twice.

    Attributes (numpy, CPU): ``shard`` int32 ``(V,)``; ``lo`` int64 ``(V,)``; ``starts`` int64
    ``(V + 1,)``, where each piece begins among the selection's samples.
    """

    shard: np.ndarray
    lo: np.ndarray
    starts: np.ndarray

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.starts)


def selection(
    counts: np.ndarray, coverage: Coverage, *, copies: int, seed: int, epoch: int, source: int, shuffle: bool
) -> Selection:
    """The source's samples in ``epoch`` (module doc, rule 2): ``copies`` whole passes and the
    coverage stream's part, pieces permuted by ``(seed, epoch, source)`` when ``shuffle``."""
    counts = np.asarray(counts, dtype=np.int64)
    whole = np.flatnonzero(counts > 0).astype(np.int32)
    c_shard, c_lo, c_count = coverage.entries(epoch)
    shard = np.concatenate([np.tile(whole, copies), c_shard])
    lo = np.concatenate([np.zeros(len(whole) * copies, np.int64), c_lo])
    count = np.concatenate([np.tile(counts[whole], copies), c_count])
    if shuffle:
        perm = np.random.default_rng([seed, epoch, source, 5]).permutation(len(shard))
        shard, lo, count = shard[perm], lo[perm], count[perm]
    return Selection(shard.astype(np.int32), lo, np.concatenate([[0], np.cumsum(count)]).astype(np.int64))


def apportion(lengths: Sequence[int], quotas: Sequence[int]) -> np.ndarray:
    """Share out consecutive rounds of ``lengths`` positions among sources in proportion to
    ``quotas`` (module doc, rule 3): each round gives each source ``floor`` of its share
    ``L * q_s / sum(q)`` plus, to as many sources as the floors leave positions, one more,
    to those the cumulative counts owe most (ties: the earlier source). So a round's count
    is the floor or ceil of its share and the running totals stay within one of the ideal
    (checked over random mixtures in ``tests/test_mixture.py``); where ``sum(lengths) ==
    sum(quotas)`` the totals are the quotas exactly (the last round makes them so). Exact
    integer arithmetic, O(rounds * K log K).

    Returns:
        int64 ``(len(lengths), K)``.
    """
    n, k = sum(quotas), len(quotas)
    out = np.zeros((len(lengths), k), np.int64)
    if n <= 0:
        return out
    taken, done = [0] * k, 0
    for j, length in enumerate(lengths):
        done += length
        if j == len(lengths) - 1 and done == n:  # the last round closes every source's count exactly
            row = [q - t for q, t in zip(quotas, taken)]
        else:
            row = [length * q // n for q in quotas]
            owed = [done * q - (t + a) * n for q, t, a in zip(quotas, taken, row)]
            for s in sorted(range(k), key=lambda s: (-owed[s], s))[: length - sum(row)]:
                row[s] += 1
        taken = [t + a for t, a in zip(taken, row)]
        out[j] = row
    return out


def apportion_prefix(
    round_length: int, totals: np.ndarray, quotas: np.ndarray, rounds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`apportion` for many rows at once, up to a round of each: row ``i`` shares out
    ``totals[i]`` positions in rounds of ``round_length`` (the last one shorter) by
    ``quotas[i]`` (summing to ``totals[i]``); returns, per row, the counts of its first
    ``rounds[i]`` rounds together and those of round ``rounds[i]`` itself (zeros past its last
    round), both ``(M, K)`` int64. The same numbers :func:`apportion` gives, computed a round
    at a time for all rows together: O(max(rounds)) numpy steps.
    """
    quotas = np.asarray(quotas, np.int64)
    totals = np.asarray(totals, np.int64)
    rounds = np.minimum(np.asarray(rounds, np.int64), -(-totals // round_length))
    m, k = quotas.shape
    rows = np.column_stack([quotas, totals, rounds])
    distinct, inverse = np.unique(rows, axis=0, return_inverse=True)
    if len(distinct) < m:  # workers of other ranks share counts and progress: replay each kind once
        before, current = apportion_prefix(round_length, distinct[:, k], distinct[:, :k], distinct[:, k + 1])
        inverse = inverse.reshape(-1)
        return before[inverse], current[inverse]
    out_taken = np.zeros((m, k), np.int64)
    out_next = np.zeros((m, k), np.int64)
    whole = rounds * round_length >= totals  # every round: the counts are the quotas
    out_taken[whole] = quotas[whole]
    live = np.flatnonzero(~whole)  # rows replayed, the others are done
    if not len(live):
        return out_taken, out_next
    big = int(totals.max()) ** 2 >= 1 << 62
    dtype: Any = object if big else np.int64  # exact past int64's range (a worker of 3 x 10^9 samples)
    q, n, upto = quotas[live].astype(dtype), totals[live].astype(dtype), rounds[live]
    taken = np.zeros((len(live), k), dtype)
    tie = np.arange(k)
    last = -(-totals[live] // round_length) - 1
    for j in range(int(upto.max()) + 1):
        length = np.minimum(round_length, n - j * round_length)
        row = length[:, None] * q // n[:, None]
        owed = (j * round_length + length)[:, None] * q - (taken + row) * n[:, None]
        key = -owed * k + tie  # by what is owed, ties to the earlier source (Python ints when big)
        extra = (length - row.sum(axis=1)).astype(np.int64)  # sources that get one more: 0 .. K-1
        cutoff = np.take_along_axis(np.sort(key, axis=1), np.maximum(extra - 1, 0)[:, None], axis=1)
        row = row + ((key <= cutoff) & (extra > 0)[:, None])
        closing = j == last  # the last round closes each count exactly
        if closing.any():
            row[closing] = q[closing] - taken[closing]
        now = upto == j
        if now.any():
            out_taken[live[now]] = taken[now].astype(np.int64)
            out_next[live[now]] = row[now].astype(np.int64)
        taken = taken + row
    return out_taken, out_next


def window_labels(counts: Sequence[int]) -> np.ndarray:
    """The order of sources within one round holding ``counts`` of each: the ``k``-th of a
    source's ``c`` goes at time ``(k + 1/2) / c`` (ties: the earlier source), so any part of
    the round holds each source near its share too. int16 ``(sum(counts),)``."""
    keys, labels = [], []
    for s, c in enumerate(counts):
        if c > 0:
            keys.append((2 * np.arange(c, dtype=np.float64) + 1) / (2.0 * c))
            labels.append(np.full(c, s, np.int16))
    if not keys:
        return np.empty(0, np.int16)
    key, label = np.concatenate(keys), np.concatenate(labels)
    return label[np.lexsort((label, key))]
