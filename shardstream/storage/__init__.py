"""Where bytes live and how they move, below both halves (packing and reading).

- :mod:`.base`: the :class:`Store` protocol every backend implements, URL parsing, and the
  :class:`Counters` the fetcher reports to;
- :mod:`.schemes`: :func:`open_store` picks the backend from the URL;
- :mod:`.local`, :mod:`.s3` (the only aiobotocore import, loaded only for ``s3://`` URLs),
  :mod:`.loop` (the background event loop S3 reads run on);
- :mod:`.fetch`: shard streams in order, S3 shards as ranged GETs running ahead in bounded
  memory, local shards in place; :mod:`.cache`: the node cache it fills and reads;
- :mod:`.shm`: small shared-memory files for a dataset's DataLoader workers.

Nothing here imports torch, :mod:`shardstream.index`, ``packing`` or ``reading``.
"""

from __future__ import annotations

from .base import Counters, ShardSink, Store, is_s3_url, split_url, write_pieces
from .local import LocalStore
from .schemes import open_store

__all__ = ["Counters", "LocalStore", "ShardSink", "Store", "is_s3_url", "open_store", "split_url", "write_pieces"]
