"""shardstream: pack small files into tar shards; stream them to PyTorch from S3 or disk.

The public API is exactly ``__all__``; everything else is internal.
"""

from .config import FetchConfig, S3Config
from .dataset import ShardDataset
from .decode.cpu import CpuDecoder, RandomResizedCrop
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
