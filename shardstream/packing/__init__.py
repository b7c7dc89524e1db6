"""The writing half: files, or other tools' shards, -> tar shards plus an index.

- :mod:`.pack`: :func:`pack`, the entry point: checks the source and destination, deals the
  job's streams to parts (:mod:`.parts`) and processes, runs them, merges the index;
- :mod:`.sources`: walks a directory tree, a file list or an S3 prefix into samples by key;
- :mod:`.destination`: what every writer shares: the option checks, the destination's checks
  and claim, the index written once every part is done, the :class:`PackReport`;
- :mod:`.stream`: one pack stream: samples -> shuffle buffer -> shards, journaled;
- :mod:`.workers`: the worker processes that run the streams (and ``pack-text``'s);
- :mod:`.writer`: one shard: deterministic tar members, published with its sample table the
  same way by every writer, and where it ends (``ShardLimits``, the listing's rule too);
- :mod:`.encode`: a sample dict from code -> tar members (the value table, the key rules);
- :mod:`.shard_writer`: :class:`ShardWriter`, samples written from code;
- :mod:`.from_code`: :func:`pack_samples`, a function over inputs in parallel processes, resumable;
- :mod:`.journal`: the resume records a crash leaves, and the merge into ``index.bin``
  (its manifest build serves the Ray datasink too);
- :mod:`.build`: ``shardstream index build``: an index for other tools' shards;
- :mod:`.verify`: every shard checked against the index; :mod:`.dali_index`: DALI's index files.

Nothing here imports torch or :mod:`shardstream.reading`; both halves share only what lies
below them (:mod:`shardstream.index`, :mod:`shardstream.storage`, the tar format).
"""

from .build import build_index
from .destination import PackReport
from .from_code import pack_samples
from .pack import OnError, pack
from .parts import Part, part_from_env
from .shard_writer import ShardWriter

__all__ = ["OnError", "PackReport", "Part", "ShardWriter", "build_index", "pack", "pack_samples", "part_from_env"]
