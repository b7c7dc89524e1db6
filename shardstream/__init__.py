"""shardstream: pack small files into tar shards; stream them to PyTorch from S3 or disk.

The public API is exactly ``__all__``; everything else is internal.
"""

from typing import TYPE_CHECKING, Any

from . import errors as _errors
from . import pack as _compat_pack  # noqa: F401 - before `pack` is bound (see pack.py)
from .config import FetchConfig, HttpConfig, RequestConfig, S3Config
from .errors import *  # noqa: F403 (the whole exception tree is public)
from .index import DatasetIndex, Index, Manifest, ShardTable, open_index
from .packing import PackReport, Part, ShardWriter, build_index, pack, pack_samples
from .reading.mixture import Source

if TYPE_CHECKING:
    from .dataset import ShardDataset, loader_state_dict
    from .decode.cpu import CpuDecoder, RandomResizedCrop

# torch is imported only when these are first used, so `shardstream pack` starts fast.
_LAZY = {
    "ShardDataset": ".dataset",
    "loader_state_dict": ".dataset",
    "CpuDecoder": ".decode.cpu",
    "RandomResizedCrop": ".decode.cpu",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardstream' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "CpuDecoder",
    "DatasetIndex",
    "FetchConfig",
    "HttpConfig",
    "Index",
    "Manifest",
    "PackReport",
    "Part",
    "RandomResizedCrop",
    "RequestConfig",
    "S3Config",
    "ShardDataset",
    "ShardTable",
    "ShardWriter",
    "Source",
    "__version__",
    "build_index",
    "loader_state_dict",
    "open_index",
    "pack",
    "pack_samples",
    *_errors.__all__,
]
