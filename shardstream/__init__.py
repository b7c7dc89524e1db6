"""shardstream: pack small files into tar shards; stream them to PyTorch from S3 or disk.

The public API is exactly ``__all__``; everything else is internal.
"""

from typing import TYPE_CHECKING, Any

from . import errors as _errors
from . import pack as _compat_pack  # noqa: F401 - before `pack` is bound (see pack.py)
from .config import FetchConfig, HttpConfig, RequestConfig, S3Config
from .errors import *  # noqa: F403 (the whole exception tree is public)
from .fields import MissingFieldError
from .index import DatasetIndex, Index, Manifest, MemberEntry, SampleEntry, ShardEntry, ShardTable, open_index
from .packing import PackReport, Part, ShardWriter, build_index, pack, pack_samples
from .packing.sources import Problem, ProblemKind
from .packing.verify import ShardCheck, verify
from .planner import JobPlan, plan
from .reading.access import SampleAccess
from .reading.assign import NodeAffinity, WorkerSlot
from .reading.batching import Batcher, CollateBatcher, RunBatcher
from .reading.mixture import Source
from .reading.slicer import FileRun
from .reading.stats import StatsSnapshot

if TYPE_CHECKING:
    from .collate import ByteBatch, ByteCollate
    from .dali import DaliLoader
    from .dataset import ShardDataset, loader_state_dict
    from .decode.cpu import CpuDecoder
    from .decode.steps import CenterCrop, RandomResizedCrop, Resize
    from .mapdataset import ShardMapDataset
    from .packing.ray_sink import ShardDatasink

# torch (and Ray) are imported only when these are first used, so `shardstream pack` starts fast;
# DaliLoader imports DALI itself only when one is made.
_LAZY = {
    "ShardDataset": ".dataset",
    "loader_state_dict": ".dataset",
    "ShardMapDataset": ".mapdataset",
    "CpuDecoder": ".decode.cpu",
    "RandomResizedCrop": ".decode.cpu",
    "Resize": ".decode.steps",
    "CenterCrop": ".decode.steps",
    "ByteBatch": ".collate",
    "ByteCollate": ".collate",
    "DaliLoader": ".dali",
    "ShardDatasink": ".packing.ray_sink",
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
    "Batcher",
    "ByteBatch",
    "ByteCollate",
    "CenterCrop",
    "CollateBatcher",
    "CpuDecoder",
    "DaliLoader",
    "DatasetIndex",
    "FetchConfig",
    "FileRun",
    "HttpConfig",
    "Index",
    "JobPlan",
    "Manifest",
    "MemberEntry",
    "MissingFieldError",
    "NodeAffinity",
    "PackReport",
    "Part",
    "Problem",
    "ProblemKind",
    "RandomResizedCrop",
    "RequestConfig",
    "Resize",
    "S3Config",
    "SampleEntry",
    "ShardCheck",
    "ShardDataset",
    "ShardDatasink",
    "SampleAccess",
    "ShardEntry",
    "ShardMapDataset",
    "ShardTable",
    "ShardWriter",
    "RunBatcher",
    "Source",
    "StatsSnapshot",
    "WorkerSlot",
    "__version__",
    "build_index",
    "loader_state_dict",
    "open_index",
    "pack",
    "pack_samples",
    "plan",
    "verify",
    *_errors.__all__,
]
