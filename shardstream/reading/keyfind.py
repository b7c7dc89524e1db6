"""A sample's place by its key, for random access (:class:`~.access.SampleAccess`): by the
shards' first and last keys where the manifest records them, else by the dataset's key index,
else by a binary search over key-sorted shards' tables. Every candidate is checked against its
shard's table; no torch."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..config import RequestConfig, S3Config
from ..errors import IndexFormatError
from ..index import DatasetIndex, ShardTable

__all__ = ["KeyFinder"]


class KeyFinder:
    """Finds ``(shard, row)`` by key in ``index``; ``table_of(shard)`` gives a shard's table
    (the caller's bounded cache of them). The key index is opened on first use."""

    def __init__(
        self,
        index: DatasetIndex,
        *,
        s3: S3Config | None,
        requests: RequestConfig | None,
        table_of: Callable[[int], ShardTable],
    ) -> None:
        self.index, self.s3, self.requests, self.table_of = index, s3, requests, table_of
        self._key_index: Any = None
        self._key_index_opened = False

    def find(self, key: str) -> tuple[int, int] | None:
        """``(shard, row)`` of the sample with ``key``, or None (:meth:`.access.SampleAccess.find`)."""
        if not isinstance(key, str):
            raise TypeError(f"key {key!r} must be a str, not {type(key).__name__}")
        read = getattr(self.index.manifest, "key_ranges", None)
        bounds = read() if callable(read) else None  # decoded once, by the manifest
        if bounds is not None:  # no GET beyond the shard's table
            firsts, lasts = bounds
            shard = bisect.bisect_left(lasts, key)
            if shard < len(lasts) and firsts[shard] <= key:
                return self._find_in(shard, key)
            return None
        keys = self._keys()
        if keys is not None:  # one small ranged GET
            for shard, row in keys.lookup(key):
                if self.table_of(int(shard)).key(int(row)) == key:
                    return int(shard), int(row)
            return None
        return self._find_sorted(key)

    def _keys(self) -> Any:
        if not self._key_index_opened:
            try:
                from ..index.keys import KeyIndex
            except ImportError:
                self._key_index = None
            else:
                self._key_index = KeyIndex.open(self.index, s3=self.s3, requests=self.requests)
            self._key_index_opened = True
        return self._key_index

    def _find_in(self, shard: int, key: str) -> tuple[int, int] | None:
        """``key`` in ``shard``, whose keys are sorted."""
        keys = self.table_of(shard).keys()
        row = bisect.bisect_left(keys, key)
        return (shard, row) if row < len(keys) and keys[row] == key else None

    def _find_sorted(self, key: str) -> tuple[int, int] | None:
        """A binary search over the shards by their tables' first and last keys, each table
        visited checked to be sorted and in order with the others visited."""
        manifest = self.index.manifest
        nonempty = np.flatnonzero(np.asarray(manifest.shard_samples) > 0)
        lo, hi = 0, len(nonempty)
        seen: list[tuple[str, str, int]] = []
        while lo < hi:
            mid = (lo + hi) // 2
            shard = int(nonempty[mid])
            keys = self.table_of(shard).keys()
            if any(a > b for a, b in itertools.pairwise(keys)):
                raise self._unsorted(f"shard {manifest.name(shard)}'s keys are not in order")
            for first, last, other in seen:
                if (other < shard and last > keys[0]) or (other > shard and first < keys[-1]):
                    raise self._unsorted(f"shards {manifest.name(other)} and {manifest.name(shard)} overlap in keys")
            seen.append((keys[0], keys[-1], shard))
            if key < keys[0]:
                hi = mid
            elif key > keys[-1]:
                lo = mid + 1
            else:
                row = bisect.bisect_left(keys, key)
                return (shard, row) if keys[row] == key else None
        return None

    def _unsorted(self, detail: str) -> IndexFormatError:
        return IndexFormatError(
            f"{self.index.root}: looking a sample up by key needs a key index, and this dataset has none and "
            f"its shards are not key-sorted ({detail}); run `shardstream index keys {self.index.root}` once"
        )
