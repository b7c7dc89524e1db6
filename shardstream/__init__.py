"""shardstream: pack small files into tar shards; stream them to PyTorch from S3 or disk.

The public API is exactly ``__all__``; everything else is internal.
"""

from typing import TYPE_CHECKING, Any

from .config import FetchConfig, S3Config
from .errors import (
    BucketNotFoundError,
    CorruptShardError,
    DecodeError,
    DestinationError,
    IndexFormatError,
    MemberNameError,
    MissingDependencyError,
    ShardNotFoundError,
    ShardstreamError,
    SourceError,
    SourceNotFoundError,
    StorageAccessError,
    StorageConnectionError,
    StorageError,
    StorageNotFoundError,
    UnreadableFileError,
)
from .index import Index
from .pack import PackReport, pack

if TYPE_CHECKING:
    from .dataset import ShardDataset
    from .decode.cpu import CpuDecoder, RandomResizedCrop

# torch is imported only when these are first used, so `shardstream pack` starts fast.
_LAZY = {"ShardDataset": ".dataset", "CpuDecoder": ".decode.cpu", "RandomResizedCrop": ".decode.cpu"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardstream' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "BucketNotFoundError",
    "CorruptShardError",
    "CpuDecoder",
    "DecodeError",
    "DestinationError",
    "FetchConfig",
    "Index",
    "IndexFormatError",
    "MemberNameError",
    "MissingDependencyError",
    "PackReport",
    "RandomResizedCrop",
    "S3Config",
    "ShardDataset",
    "ShardNotFoundError",
    "ShardstreamError",
    "SourceError",
    "SourceNotFoundError",
    "StorageAccessError",
    "StorageConnectionError",
    "StorageError",
    "StorageNotFoundError",
    "UnreadableFileError",
    "__version__",
    "pack",
]
