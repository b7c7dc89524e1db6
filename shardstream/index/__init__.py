"""The dataset index: what ``pack`` writes beside the shards, read back and validated.

Version 2, what ``pack`` writes (cost O(shards) to open, per-sample data read only where
needed):

- ``index.bin``: the manifest, one row per shard as numeric columns: name, bytes, sample and
  member counts, CRC-32 (:mod:`.manifest`);
- ``NAME.samples`` beside each shard ``NAME``: its samples' keys and members with their
  payload offsets and sizes (:mod:`.table`).

- ``keys/``: the key index, sample key -> (shard, row), hash-partitioned (:mod:`.keys`).

:mod:`.status` reads a writer's state beside them (``.shardstream/``), so that an unfinished
pack is never taken for a dataset.

All use one binary container (:mod:`.container`). :mod:`.resolve` opens a dataset (version 2,
or a version 1 ``index.json``, :mod:`.v1`, converted in memory) and upgrades version 1 in place.
Nothing here imports torch.
"""

from .keys import KEYS_DIR, KeyIndex, KeyIndexReport, build_key_index, write_key_index, write_with_keys
from .manifest import MANIFEST_NAME, TABLE_SUFFIX, Manifest
from .resolve import DatasetIndex, ShardUrls, open_index, resolve_source, upgrade
from .status import PackStatus, unfinished_pack
from .table import ShardTable, TableSpool
from .v1 import (
    INDEX_FORMAT,
    INDEX_NAME,
    INDEX_VERSION,
    Index,
    MemberEntry,
    SampleEntry,
    ShardEntry,
    ShardJson,
    sample_json,
    shard_json_head,
    write_index,
)

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "INDEX_VERSION",
    "KEYS_DIR",
    "MANIFEST_NAME",
    "TABLE_SUFFIX",
    "DatasetIndex",
    "Index",
    "KeyIndex",
    "KeyIndexReport",
    "Manifest",
    "MemberEntry",
    "PackStatus",
    "SampleEntry",
    "ShardEntry",
    "ShardJson",
    "ShardTable",
    "ShardUrls",
    "TableSpool",
    "build_key_index",
    "open_index",
    "resolve_source",
    "sample_json",
    "shard_json_head",
    "unfinished_pack",
    "upgrade",
    "write_index",
    "write_key_index",
    "write_with_keys",
]
