"""Reader metrics shared by a dataset's DataLoader workers.

Each reader (the main process, or one DataLoader worker) owns one row of float64 counters in
a small file that every process of the dataset maps (:mod:`shardstream.storage.shm`), so
:meth:`ShardDataset.stats` in the training process sums what its workers did without any
message passing. Updating a counter is a store into shared memory: nothing per step beyond that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..storage.shm import SharedFile

__all__ = ["ReaderStats", "StatsBoard", "StatsSnapshot"]

# Column of each counter in a row.
FIELDS = (
    "started_at",  # time.time() when the reader started its first epoch iterator (0: never)
    "first_sample_s",  # seconds from that start to its first sample (-1: none yet)
    "samples",
    "bytes",  # payload bytes of the samples yielded
    "stall_s",  # seconds the reader waited on data that had not arrived
    "cache_hits",
    "cache_misses",
    "cache_fills",  # shards this reader downloaded into the node cache
    "cache_waits",  # shards another process was downloading into the cache when this reader wanted them
    "cache_bypasses",  # shards read from S3 past the cache (no room, or another's download took too long)
    "retries",  # S3 requests or body reads sent again after a failure
    "bytes_in_flight",  # gauge: bytes held by downloads not yet consumed
    "skipped",  # samples replaced under on_error="skip" (undecodable, or in a corrupt part of a shard)
)
_COL = {name: i for i, name in enumerate(FIELDS)}


@dataclass(frozen=True)
class StatsSnapshot:
    """Totals over all readers of one dataset in this process and its DataLoader workers.

    Attributes:
        readers: readers (processes) that have started.
        samples, bytes: samples and payload bytes yielded.
        elapsed_s: seconds since the first reader started.
        samples_per_s, bytes_per_s: ``samples`` and ``bytes`` over ``elapsed_s``.
        stall_s: seconds readers waited on data (summed over readers).
        first_sample_s: seconds from a reader's start to its first sample, the smallest over
            readers; None before any sample.
        cache_hits, cache_misses: shard lookups in the node-local cache; ``cache_hit_rate``
            is hits / lookups (None without lookups).
        cache_fills: shards these readers downloaded into the cache.
        cache_waits: shards another process was downloading into the cache when a reader
            wanted them (it waited up to ``FetchConfig.cache_wait_s`` for the entry).
        cache_bypasses: shards read from S3 without the cache: no room (the rest pinned or
            being filled), or another process's download did not finish in time.
        retries: S3 requests or body reads sent again after a failure.
        bytes_in_flight: bytes held by downloads not yet consumed, now.
        skipped: samples skipped under ``on_error="skip"`` (each replaced by a repeat).
        source_samples: of a mixture, samples yielded per source name (empty otherwise).
    """

    readers: int
    samples: int
    bytes: int
    elapsed_s: float
    samples_per_s: float
    bytes_per_s: float
    stall_s: float
    first_sample_s: float | None
    cache_hits: int
    cache_misses: int
    cache_hit_rate: float | None
    retries: int
    bytes_in_flight: int
    skipped: int = 0
    cache_fills: int = 0
    cache_waits: int = 0
    cache_bypasses: int = 0
    source_samples: dict[str, int] = field(default_factory=dict)

    def log_line(self) -> str:
        """One human-readable line of these figures."""
        first = f"{self.first_sample_s:.2f} s" if self.first_sample_s is not None else "-"
        hit = f"{self.cache_hit_rate:.0%}" if self.cache_hit_rate is not None else "-"
        return (
            f"shardstream: {self.samples} samples, {self.samples_per_s:.0f} samples/s, "
            f"{self.bytes_per_s / 1e6:.1f} MB/s, stall {self.stall_s:.1f} s, first sample {first}, "
            f"cache hits {hit} (fills {self.cache_fills}, waits {self.cache_waits}, bypasses {self.cache_bypasses}), "
            f"retries {self.retries}, skipped {self.skipped}, in flight {self.bytes_in_flight / 2**20:.0f} MiB "
            f"({self.readers} readers)"
            + (
                "; per source " + ", ".join(f"{name} {n}" for name, n in self.source_samples.items())
                if self.source_samples
                else ""
            )
        )


class StatsBoard:
    """The shared counters file of one dataset: ``num_rows`` rows of :data:`FIELDS`.

    Created by the dataset in the training process (:class:`~shardstream.storage.shm.SharedFile`);
    DataLoader workers re-open it by path after unpickling. Row 0 is the main process; row
    ``worker_id + 1`` a DataLoader worker.
    """

    def __init__(self, num_rows: int = 257, sources: tuple[str, ...] = ()) -> None:
        self.num_rows = num_rows
        self.sources = tuple(sources)  # a mixture's source names: one more counter each
        self.width = len(FIELDS) + len(self.sources)
        self._file = SharedFile("shardstream-stats", num_rows * self.width * 8)
        self._table: np.ndarray | None = None

    @property
    def path(self) -> str:
        return self._file.path

    def __getstate__(self) -> dict[str, object]:
        return {
            "num_rows": self.num_rows,
            "sources": self.sources,
            "width": self.width,
            "_file": self._file,
            "_table": None,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    def table(self) -> np.ndarray | None:
        """The mapped ``(num_rows, width)`` float64 array; None if the file is gone."""
        if self._table is None:
            mapped = self._file.buffer()
            if mapped is None:
                return None
            self._table = np.ndarray((self.num_rows, self.width), dtype=np.float64, buffer=mapped)
        return self._table

    def reader(self, row: int) -> ReaderStats:
        """Counters of the reader owning ``row`` (cleared for a new iteration)."""
        table = self.table()
        if table is None or not 0 <= row < self.num_rows:
            return ReaderStats(np.zeros(self.width))
        table[row] = 0.0
        table[row, _COL["first_sample_s"]] = -1.0
        return ReaderStats(table[row])

    def snapshot(self) -> StatsSnapshot:
        """Totals over every row."""
        table = self.table()
        rows = table[table[:, _COL["started_at"]] > 0] if table is not None else np.zeros((0, self.width))
        col = {name: rows[:, i] for name, i in _COL.items()}
        started = float(col["started_at"].min()) if len(rows) else 0.0
        elapsed = max(time.time() - started, 1e-9) if len(rows) else 0.0
        samples, nbytes = int(col["samples"].sum()), int(col["bytes"].sum())
        firsts = col["first_sample_s"][col["first_sample_s"] >= 0]
        hits, misses = int(col["cache_hits"].sum()), int(col["cache_misses"].sum())
        return StatsSnapshot(
            readers=len(rows),
            samples=samples,
            bytes=nbytes,
            elapsed_s=elapsed,
            samples_per_s=samples / elapsed if elapsed else 0.0,
            bytes_per_s=nbytes / elapsed if elapsed else 0.0,
            stall_s=float(col["stall_s"].sum()),
            first_sample_s=float(firsts.min()) if len(firsts) else None,
            cache_hits=hits,
            cache_misses=misses,
            cache_hit_rate=hits / (hits + misses) if hits + misses else None,
            retries=int(col["retries"].sum()),
            bytes_in_flight=int(col["bytes_in_flight"].sum()),
            skipped=int(col["skipped"].sum()),
            cache_fills=int(col["cache_fills"].sum()),
            cache_waits=int(col["cache_waits"].sum()),
            cache_bypasses=int(col["cache_bypasses"].sum()),
            source_samples={name: int(rows[:, len(FIELDS) + i].sum()) for i, name in enumerate(self.sources)},
        )


class ReaderStats:
    """One reader's row; the fetcher and dataset add to it as they go."""

    def __init__(self, row: np.ndarray) -> None:
        self._row = row
        self._start = time.perf_counter()
        row[_COL["started_at"]] = time.time()

    def add(self, field: str, amount: float) -> None:
        self._row[_COL[field]] += amount

    def add_sources(self, counts: np.ndarray) -> None:
        """Samples yielded of each source of a mixture (int ``(K,)``, the board's order)."""
        self._row[len(FIELDS) : len(FIELDS) + len(counts)] += counts

    def set(self, field: str, value: float) -> None:
        self._row[_COL[field]] = value

    def samples(self, count: int, payload_bytes: int) -> None:
        """``count`` samples of ``payload_bytes`` in all, yielded (counted a batch at a time)."""
        row = self._row
        if row[_COL["samples"]] == 0 and count:
            row[_COL["first_sample_s"]] = time.perf_counter() - self._start
        row[_COL["samples"]] += count
        row[_COL["bytes"]] += payload_bytes
