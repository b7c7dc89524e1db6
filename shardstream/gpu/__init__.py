"""Batched GPU loading: the decoder-independent half of a GPU loader (fields, feed, skip,
fallback, lifecycle), which a GPU decoder's graph plugs into (:mod:`shardstream.dali`).

- :mod:`.loader`: :class:`GpuLoader`, the loader: reading workers, the epoch, the CPU fallback
  of failed batches, counters, shutdown;
- :mod:`.feed`: the thread that assembles whole batches ahead for the decoder;
- :mod:`.items`: the members picked (``fields=``) and each sample as an item, encoded or
  decoded on the CPU, in the reader.

The graph is a :class:`~shardstream.decode.protocol.BatchDecoder` (with its
:class:`~shardstream.decode.protocol.CpuFallback`): a new GPU decoder is one such class, not a
copy of the loader. Importing this package does not import torch (a loader does, when made)."""

from ..decode.protocol import BatchDecoder, CpuFallback
from .loader import GpuLoader

__all__ = ["BatchDecoder", "CpuFallback", "GpuLoader"]
