"""shardstream: pack small files into tar shards; stream them to PyTorch from S3 or disk.

The public API is exactly ``__all__``; everything else is internal.
"""

from typing import TYPE_CHECKING, Any

from . import errors as _errors
from . import pack as _compat_pack  # noqa: F401 - before `pack` is bound (see pack.py)
from .config import (
    Affinity,
    FetchConfig,
    HttpConfig,
    LastBatch,
    MixMode,
    OnError,
    OrderSettings,
    RequestConfig,
    S3Config,
    StoreSettings,
)
from .decode.protocol import BatchDecoder, BatchSource, Decoder, register_decoder
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
from .reading.engine import ReadingEngine
from .reading.epochs import PassState
from .reading.filerun import FileRun
from .reading.mixture import Source
from .reading.plan import PlanRun, WorkerPlan
from .reading.shards import ShardSet
from .reading.stages import ItemUnit, PassContext, PassProgress, Stage
from .reading.stats import ReaderStats, StatsSnapshot
from .storage import RemoteStore, ShardSink, Store, register_store
from .storage.base import OnRetry, StoreFactory
from .tarstream import Batch
from .tokens import TokenIndex, TokenManifest
from .tokens.blocks import TokenBlockUnit
from .tokens.writer import TokenDatasetWriter

if TYPE_CHECKING:
    from .collate import ByteBatch, ByteCollate
    from .dali import DaliLoader
    from .dataset import ShardDataset, loader_state_dict
    from .decode.cpu import CpuDecoder
    from .decode.steps import CenterCrop, RandomResizedCrop, Resize
    from .mapdataset import ShardMapDataset
    from .packing.ray_sink import ShardDatasink
    from .tokens.dataset import PackedDocuments, TokenBlocks, collate_blocks

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
    "TokenBlocks": ".tokens.dataset",
    "PackedDocuments": ".tokens.dataset",
    "collate_blocks": ".tokens.dataset",
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
    "PackedDocuments",
    "TokenBlockUnit",
    "TokenBlocks",
    "TokenDatasetWriter",
    "TokenIndex",
    "TokenManifest",
    "collate_blocks",
    "PlanRun",
    "WorkerPlan",
    "Batch",
    "StoreFactory",
    "ShardSink",
    "OnRetry",
    "ReadingEngine",
    "ReaderStats",
    "PassState",
    "PassProgress",
    "ShardSet",
    "BatchSource",
    "Affinity",
    "BatchDecoder",
    "Batcher",
    "ByteBatch",
    "ByteCollate",
    "CenterCrop",
    "CollateBatcher",
    "CpuDecoder",
    "DaliLoader",
    "DatasetIndex",
    "Decoder",
    "FetchConfig",
    "FileRun",
    "HttpConfig",
    "Index",
    "ItemUnit",
    "JobPlan",
    "LastBatch",
    "Manifest",
    "MemberEntry",
    "MissingFieldError",
    "MixMode",
    "NodeAffinity",
    "OnError",
    "OrderSettings",
    "PackReport",
    "Part",
    "PassContext",
    "Problem",
    "ProblemKind",
    "RandomResizedCrop",
    "RemoteStore",
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
    "Stage",
    "StatsSnapshot",
    "Store",
    "StoreSettings",
    "WorkerSlot",
    "__version__",
    "build_index",
    "loader_state_dict",
    "open_index",
    "pack",
    "pack_samples",
    "plan",
    "register_decoder",
    "register_store",
    "verify",
    *_errors.__all__,
]
