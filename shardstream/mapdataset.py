"""``ShardMapDataset``: a map-style ``torch.utils.data.Dataset`` over a packed dataset, for a
true per-sample global shuffle (``RandomSampler``, ``DistributedSampler``): each sample is one
ranged read of its bytes (:class:`~shardstream.reading.access.SampleAccess`), and a batch's
samples (``__getitems__``) are read together, neighbouring ranges of a shard merged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import Dataset

from .config import FetchConfig, RequestConfig, S3Config, StoreSettings
from .decode.cpu import ImageFormat
from .decode.stage import make_decoder
from .index import open_index
from .index.resolve import warn_if_partial
from .reading.access import SampleAccess

__all__ = ["ShardMapDataset"]


class ShardMapDataset(Dataset[Any]):
    """Samples of a dataset written by ``shardstream pack`` (or indexed by ``index build``), by
    global index: shards in index order, samples in shard order.

    Args:
        location: the dataset's directory, ``s3://``, ``https://``, ``hf://``, ``gs://`` or
            ``az://`` prefix, or its index file.
        decode, fields: as ``ShardDataset`` (None: raw bytes per member).
        s3, requests, fetch, cache_dir, cache_limit_bytes: as ``ShardDataset``.
        max_tables, merge_gap_bytes, hot_shard_reads: as
            :class:`~shardstream.reading.access.SampleAccess`.

    ``dataset[i]`` gives ``{"__key__": str, "__shard__": URL, "<ext>": bytes, ...}`` decoded as
    ``decode`` and ``fields`` say, as streaming yields it. Opening reads ``index.bin`` only;
    tables are fetched on first use, connections opened lazily in each DataLoader worker.

    Raises:
        ShardNotFoundError, IndexFormatError: no or a bad index at ``location``.
        ValueError: a bad ``decode``, ``fields`` or setting.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        decode: ImageFormat | Callable[[dict[str, Any]], Any] | None = None,
        fields: Mapping[str, str] | Sequence[str] | None = None,
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        fetch: FetchConfig | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        max_tables: int = 64,
        merge_gap_bytes: int = 64 << 10,
        hot_shard_reads: int = 8,
    ) -> None:
        store = StoreSettings(
            s3=s3, requests=requests, fetch=fetch, cache_dir=cache_dir, cache_limit_bytes=cache_limit_bytes
        )
        self.index = open_index(location, s3=s3, requests=requests)
        warn_if_partial(self.index)
        self.access = SampleAccess(
            self.index,
            store=store,
            max_tables=max_tables,
            merge_gap_bytes=merge_gap_bytes,
            hot_shard_reads=hot_shard_reads,
        )
        self.decode = make_decoder(decode, fields=fields)

    def __repr__(self) -> str:
        return f"ShardMapDataset({self.index.root!r}, num_samples={len(self)})"

    def __len__(self) -> int:
        return self.access.num_samples

    @property
    def classes(self) -> list[str] | None:
        """The class names of the index (``pack --labels-from-dirs``), in class-index order; or None."""
        return self.index.manifest.classes

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """``{class name: class index}`` of :attr:`classes`, or None."""
        classes = self.classes
        return None if classes is None else {name: i for i, name in enumerate(classes)}

    def stats(self) -> dict[str, int]:
        """This process's random-access counts (:meth:`SampleAccess.stats`)."""
        return self.access.stats()

    def __getitem__(self, i: int) -> Any:
        """The sample at global index ``i`` (negative from the end): one ranged read.

        Raises:
            IndexError: ``i`` out of range. CorruptShardError, DecodeError, storage errors.
        """
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, in that order, read together (a DataLoader's batch).

        Raises:
            as :meth:`__getitem__`.
        """
        return self.access.samples(indices, self.decode)

    def get(self, key: str) -> Any:
        """The sample with ``key``.

        Raises:
            KeyError: no sample has ``key`` (names it and the dataset).
        """
        return self.access.samples([key], self.decode)[0]
