"""``ShardDataset``: shards from local disk or S3 as a stream of samples for a DataLoader."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from .assign import WorkerSlot, assign_shards, current_slot, distributed_rank
from .config import FetchConfig, S3Config
from .decode.cpu import ImageFormat, make_decoder
from .errors import CorruptShardError, ShardNotFoundError
from .fetch import iter_shard_streams
from .index import INDEX_NAME, Index
from .shuffle import shuffle_buffer
from .stats import ReaderStats, StatsBoard, StatsSnapshot
from .storage import is_s3_url, open_store, split_url
from .tarstream import iter_samples

__all__ = ["ShardDataset"]

log = logging.getLogger("shardstream")

Source = str | os.PathLike[str] | Sequence[str]


class ShardDataset(IterableDataset):
    """Samples of tar shards, streamed from local disk or S3, shuffled and split over the job.

    Each epoch, the shard order is a permutation seeded by ``(seed, epoch)``, the same on
    every rank; shard ``i`` of that order goes to reader ``i % (world_size * num_workers)``
    (rank from ``torch.distributed`` when initialised, else ``RANK`` / ``WORLD_SIZE``; worker
    from the DataLoader). Each reader streams its shards in order (S3 shards downloading
    ahead, local shards read in place), groups members into samples and passes them through
    a shuffle buffer of ``shuffle_buffer`` samples. Every sample is read once per epoch.

    Args:
        source: a dataset written by ``shardstream pack`` (a local directory, an
            ``s3://bucket/prefix``, or its ``index.json``), a shard URL, a brace pattern of
            shard URLs (``"s3://b/data-{000000..000009}.tar"``), or a list of shard URLs.
        shuffle: shuffle shard order and samples; ``False`` yields shards in index order and
            samples in shard order (split over readers as above).
        shuffle_buffer: samples held by each reader's shuffle buffer.
        seed: seed of shard order and sample shuffle; combine with :meth:`set_epoch`.
        decode: ``None`` (members as ``bytes``), ``"pil"``, ``"numpy"``, ``"torch"`` (see
            :mod:`shardstream.decode.cpu`), or a callable taking and returning a sample.
        s3: S3 endpoint and credentials; default the standard AWS environment.
        fetch: read-ahead of S3 shards: ranged GET size, requests in flight, memory bound
            ``max_buffer_bytes`` per reader (:class:`~shardstream.config.FetchConfig`).
        cache_dir: a node-local directory caching ``s3://`` shards, shared safely by every
            rank and worker of the node (one download per shard per node); the next epoch
            reads hits from local disk. None: no cache.
        cache_limit_bytes: the cache's size bound (required with ``cache_dir``); least
            recently used shards are evicted, never one being read, never a file the cache
            did not create.
        log_every_s: when set, reader 0 of this process logs :meth:`stats` (logger
            ``"shardstream"``, INFO) every ``log_every_s`` seconds while iterating.

    Yields:
        dicts ``{"__key__": str, "__shard__": shard URL, "<ext>": bytes, ...}``, one entry
        per member extension (decoded as ``decode`` says).

    Raises:
        ShardNotFoundError: no index at a dataset location, or (while iterating) a shard URL
            that does not exist.
        IndexFormatError: the index is malformed.
        CorruptShardError: a shard's tar stream is malformed or truncated (while iterating).
        StorageAccessError, StorageConnectionError, BucketNotFoundError: S3 problems.
    """

    def __init__(
        self,
        source: Source,
        *,
        shuffle: bool = True,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        decode: ImageFormat | Callable[[dict[str, Any]], Any] | None = None,
        s3: S3Config | None = None,
        fetch: FetchConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        log_every_s: float | None = None,
    ) -> None:
        super().__init__()
        if cache_dir is not None and (not isinstance(cache_limit_bytes, int) or cache_limit_bytes < 1):
            raise ValueError(f"{cache_limit_bytes=} must be an int >= 1 (bytes) when cache_dir is set")
        if log_every_s is not None and not log_every_s > 0:
            raise ValueError(f"{log_every_s=} must be > 0 (seconds) or None")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise ValueError(f"{shuffle_buffer=} must be an int >= 0 (samples)")
        if not isinstance(seed, int):
            raise ValueError(f"{seed=} must be an int")
        self.s3 = s3
        self.fetch = fetch or FetchConfig()
        self.shard_urls, self.index = _resolve_source(source, s3=s3)
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.decode = make_decoder(decode)
        self.epoch = 0
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.cache_limit_bytes = cache_limit_bytes
        self.log_every_s = log_every_s
        self._board = StatsBoard()

    def __repr__(self) -> str:
        return (
            f"ShardDataset({self.num_shards} shards, num_samples={self.num_samples}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )

    @property
    def num_shards(self) -> int:
        return len(self.shard_urls)

    @property
    def num_samples(self) -> int | None:
        """Samples in the whole dataset, from the index; None for bare shard URLs."""
        return self.index.num_samples if self.index is not None else None

    def stats(self) -> StatsSnapshot:
        """Reading metrics summed over this process and its DataLoader workers, since each
        reader's latest iterator started: samples/s, bytes/s, stall time, time to first
        sample, cache hit rate, retries, bytes in flight (:class:`~shardstream.stats.StatsSnapshot`)."""
        return self._board.snapshot()

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s shard order and shuffle from the next iteration on.

        Call it before creating the DataLoader iterator of each epoch (with
        ``persistent_workers=True`` the workers keep the epoch they started with).
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"{epoch=} must be an int >= 0")
        self.epoch = epoch

    def shards_for(self, slot: WorkerSlot) -> list[str]:
        """The shard URLs ``slot`` reads this epoch, in reading order."""
        ids = assign_shards(self.num_shards, slot, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        return [self.shard_urls[i] for i in ids]

    def __getstate__(self) -> dict[str, Any]:
        # Runs in the main process when a DataLoader hands the dataset to spawned workers,
        # which do not inherit torch.distributed: record the rank it knows here.
        state = self.__dict__.copy()
        state["_parent_rank"] = distributed_rank()
        return state

    def __iter__(self) -> Iterator[Any]:
        slot = current_slot(self.__dict__.get("_parent_rank"))
        stats = self._board.reader(slot.worker_id + 1 if _in_worker() else 0)
        samples = self._read(self.shards_for(slot), stats)
        if self.shuffle and self.shuffle_buffer > 1:
            seed = int(np.random.SeedSequence([self.seed, self.epoch, slot.index]).generate_state(1)[0])
            samples = shuffle_buffer(samples, capacity_samples=self.shuffle_buffer, rng=random.Random(seed))
        decode = self.decode
        log_every_s = self.log_every_s if slot.worker_id == 0 else None
        next_log = time.monotonic() + log_every_s if log_every_s else float("inf")
        for sample in samples:
            stats.sample(_payload_bytes(sample))
            if time.monotonic() >= next_log:
                log.info("%s", self.stats().log_line())
                next_log = time.monotonic() + log_every_s  # type: ignore[operator]
            yield decode(sample) if decode is not None else sample

    def _read(self, urls: list[str], stats: ReaderStats) -> Iterator[dict[str, Any]]:
        expected = self._expected_counts()
        sizes = self._expected_sizes()
        cache = None
        if self.cache_dir is not None:
            from .cache import ShardCache

            cache = ShardCache(self.cache_dir, cache_limit_bytes=self.cache_limit_bytes)  # type: ignore[arg-type]
        streams = iter_shard_streams(
            urls, sizes_bytes=[sizes.get(u) for u in urls], s3=self.s3, fetch=self.fetch, cache=cache, stats=stats
        )
        for url, stream in streams:
            count = 0
            for sample in iter_samples(stream, url=url):
                count += 1
                yield sample
            if expected and count != expected[url]:
                raise CorruptShardError(
                    f"{url}: holds {count} samples but the index says {expected[url]}; the shard "
                    "or index.json is stale or damaged, re-pack or re-upload the dataset"
                )

    def _expected_sizes(self) -> dict[str, int]:
        if self.index is None:
            return {}
        return {url: shard.bytes for url, shard in zip(self.shard_urls, self.index.shards)}

    def _expected_counts(self) -> dict[str, int]:
        if self.index is None:
            return {}
        return {url: shard.num_samples for url, shard in zip(self.shard_urls, self.index.shards)}


def _payload_bytes(sample: dict[str, Any]) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__") and isinstance(v, (bytes, bytearray)))


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def _normalize(url: str) -> str:
    if is_s3_url(url):
        return url
    if url.startswith("file://"):
        url = url[len("file://") :]
    if "://" in url:
        raise ValueError(f"{url!r}: unsupported URL scheme; use s3://BUCKET/KEY or a local path")
    return os.path.abspath(url)


def _resolve_source(source: Source, *, s3: S3Config | None) -> tuple[list[str], Index | None]:
    """Shard URLs (and the index, when there is one) of a ``ShardDataset`` source."""
    if isinstance(source, (list, tuple)):
        urls = [_normalize(os.fspath(u)) for u in source]
        if not urls:
            raise ValueError("source is an empty list of shard URLs")
        return urls, None
    text = os.fspath(source)  # type: ignore[arg-type]
    if "{" in text:
        from braceexpand import braceexpand

        return [_normalize(u) for u in braceexpand(text)], None
    if text.endswith(".tar"):
        return [_normalize(text)], None
    if text.endswith(".json"):
        root, index_name = split_url(_normalize(text))
    else:
        root, index_name = _normalize(text).rstrip("/"), INDEX_NAME
    store = open_store(root or os.sep, s3=s3)
    index_url = store.url_of(index_name)
    try:
        data = store.read_bytes(index_name)
    except ShardNotFoundError as exc:
        raise ShardNotFoundError(
            f"{index_url}: no index here; pass a directory or s3:// prefix written by "
            "shardstream pack, its index.json, or shard URLs (a list or a brace pattern)"
        ) from exc
    index = Index.from_json(data, url=index_url)
    return [store.url_of(shard.name) for shard in index.shards], index
