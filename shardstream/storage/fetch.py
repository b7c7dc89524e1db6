"""Compatibility: the remote producer moved to :mod:`.producer` (this commit keeps its history)."""

from .producer import iter_shard_streams

__all__ = ["iter_shard_streams"]
