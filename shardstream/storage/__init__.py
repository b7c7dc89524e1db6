"""Where bytes live and how they move, below both halves (packing and reading).

- :mod:`.base`: the :class:`Store` protocol every backend implements, :class:`RemoteStore`
  (what the fetcher reads from a server), URL parsing, and the :class:`Counters` the fetcher
  reports to;
- :mod:`.schemes`: :func:`open_store` makes the store of a URL with the factory registered
  for its scheme (:func:`register_store`; the built-in backends each loaded on first use),
  :func:`pin_urls` fixes URLs' versions (a Hub revision to its commit);
- :mod:`.local`; the remote backends :mod:`.s3` (the only aiobotocore import), :mod:`.http`
  (http(s), aiohttp), :mod:`.hf` (the Hugging Face Hub), :mod:`.gcs` (gcsfs), :mod:`.azure`
  (adlfs), each giving one request function and one error table to :mod:`.ranged` (the
  resumable ranged read and the one retry loop under every remote store's requests,
  governed by a :class:`~shardstream.config.RequestConfig`); :mod:`.requests` (what these
  backends share: counts of open requests, per-process clients, common Store methods, the
  part-by-part upload sink); :mod:`.loop` (the background event loop remote reads run on);
- :mod:`.fetch`: :func:`iter_shard_streams`, shard streams in order; :mod:`.producer`: remote
  shards as ranged GETs running ahead in bounded memory (and the one function that cuts that
  budget, ``share_read_ahead``); :mod:`.streams`: the stream adapters (local shards memory-mapped
  in place, remote bodies, cache entries), each a :class:`~shardstream.tarstream.ShardStream`;
  :mod:`.fill`: a cache entry claimed and filled while it is read; :mod:`.cache`: the node cache;
- :mod:`.shm`: small shared-memory files for a dataset's DataLoader workers.

Nothing here imports torch, :mod:`shardstream.index`, ``packing`` or ``reading``.
"""

from __future__ import annotations

from .base import (
    REMOTE_SCHEMES,
    Counters,
    RemoteStore,
    ShardSink,
    Store,
    is_remote_url,
    is_s3_url,
    register_store,
    remote_schemes,
    scheme_of,
    split_url,
    write_pieces,
)
from .local import LocalStore
from .schemes import open_store, pin_urls

__all__ = [
    "REMOTE_SCHEMES",
    "Counters",
    "LocalStore",
    "RemoteStore",
    "ShardSink",
    "Store",
    "is_remote_url",
    "is_s3_url",
    "open_store",
    "pin_urls",
    "register_store",
    "remote_schemes",
    "scheme_of",
    "split_url",
    "write_pieces",
]
