"""Opening the dataset to plan: its index (or each source's) read as a rank reads it, the shards
as arrays (:class:`Data`: samples, bytes, members and sample-table bytes per shard, sources laid
end to end), and the opening timed.

A rank's ``open_s`` is not timed here unless ``probe=True``: then :func:`time_open` times making
the job's ``ShardDataset`` in this process, its first store access (the client made cold, the
index read, the reader set up); imports come first, as process start-up, which the planner
leaves out. Without ``torch`` (no ``ShardDataset``), the planner's own opening of the index
(:func:`open_data`) stands in.

A local dataset's sample tables are measured (``stat``, up to 200,000 shards); elsewhere a
table's bytes are estimated: a header, 24 B a sample and ~50 B a member (its name); an index
of a dataset given as arrays, 51 B a shard and 416 B more.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import S3Config
from ..reading.mixture import Source, sources_of
from ..storage.base import scheme_of

__all__ = ["Counts", "Data", "import_client_library", "open_data", "store_kind", "time_open"]

_TABLE_HEADER_BYTES = 400  # a sample table's header and column offsets, about
_STAT_TABLES_UP_TO = 200_000  # a local dataset's tables whose sizes are read (stat) rather than estimated


@dataclass
class Data:
    """The shards of a dataset or mixture (sources laid end to end) as arrays."""

    counts: np.ndarray
    nbytes: np.ndarray
    members: np.ndarray
    source_starts: list[int]
    names: list[str]
    store: str
    index_bytes: list[int]
    sources: list[Source] | None = None
    epoch_samples: int | None = None
    mix: str = "stratified"
    indexes: list[Any] | None = None
    location_for_probe: str | None = None
    table_bytes: np.ndarray = field(default=None)  # type: ignore[assignment]
    open_s: float | None = None  # the planner's opening of the index(es), timed

    def __post_init__(self) -> None:
        if self.table_bytes is None:  # NAME.samples: a header, 24 B a sample, ~50 B a member (its name)
            self.table_bytes = _TABLE_HEADER_BYTES + 24 * self.counts + 50 * self.members

    @property
    def num_sources(self) -> int:
        return len(self.source_starts) - 1

    @property
    def bytes_per_sample(self) -> float:
        """The dataset's mean bytes a sample."""
        return float(self.nbytes.sum()) / max(1, int(self.counts.sum()))


class Counts:
    """A ShardSet's two attributes the schedules read (sample counts, shards)."""

    def __init__(self, counts: np.ndarray) -> None:
        self.sample_counts = counts
        self.num_shards = len(counts)


def store_kind(location: str) -> str:
    """``"s3"``, ``"gs"``, ``"az"``, ``"http"`` (http(s), the Hub) or ``"local"``: the store
    ``location`` is in (whose default figures a plan takes)."""
    scheme = scheme_of(location)
    if scheme is None:
        return "local"
    if scheme in ("s3", "gs", "az"):
        return scheme
    return "http"  # http(s), the Hub


def open_data(
    dataset: Any, *, s3: S3Config | None, epoch_samples: int | None, mix: str, shard_affinity: str | None
) -> Data:
    """The shards of ``dataset`` (a location, or a list of :class:`~shardstream.Source`), its
    indexes opened as a rank opens them, and timed.

    Raises:
        ValueError: shard URLs without an index, ``epoch_samples`` without a mixture, or a
            mixture with ``shard_affinity``.
        ShardNotFoundError, IndexFormatError: as :func:`~shardstream.open_index`.
    """
    from ..index.resolve import open_index

    sources, locations = _locations(dataset, epoch_samples=epoch_samples, shard_affinity=shard_affinity)
    import_client_library(locations)  # imports are process start-up: not in open_s
    began = time.perf_counter()
    indexes = [open_index(loc, s3=s3) for loc in locations]
    open_s = time.perf_counter() - began
    counts = [np.asarray(ix.manifest.shard_samples, np.int64) for ix in indexes]
    index_bytes = []
    for loc, ix in zip(locations, indexes):
        path = ix.manifest.url
        size = os.path.getsize(path) if scheme_of(loc) is None and os.path.isfile(path) else None
        index_bytes.append(size or 51 * ix.num_shards + 416)
    return Data(
        table_bytes=_table_bytes(locations, indexes),  # type: ignore[arg-type]
        counts=np.concatenate(counts),
        nbytes=np.concatenate([np.asarray(ix.manifest.shard_bytes, np.int64) for ix in indexes]),
        members=np.concatenate([np.asarray(ix.manifest.shard_members, np.int64) for ix in indexes]),
        source_starts=[0, *np.cumsum([len(c) for c in counts]).tolist()],
        names=[src.label for src in sources] if sources is not None else [locations[0]],
        store=store_kind(locations[0]),
        index_bytes=index_bytes,
        sources=sources,
        epoch_samples=epoch_samples,
        mix=mix,
        indexes=indexes,
        location_for_probe=locations[0],
        open_s=open_s,
    )


def _locations(
    dataset: Any, *, epoch_samples: int | None, shard_affinity: str | None
) -> tuple[list[Source] | None, list[str]]:
    """``dataset``'s sources (None: one dataset) and the locations of their indexes. One whole
    source is a plain dataset, as the reader reads it.

    Raises:
        ValueError: as :func:`open_data`.
    """
    sources = sources_of(dataset)
    if sources is not None and len(sources) == 1 and sources[0].rule() == {"repeat": 1.0} and epoch_samples is None:
        dataset, sources = sources[0].location, None  # one whole source: a plain dataset, as the reader does
    if sources is None:
        if isinstance(dataset, (list, tuple)):
            raise ValueError(
                "plan() needs a dataset location with an index (or a list of Source); shard URLs without an "
                "index have no sample counts to plan with: pack them or `shardstream index build` them"
            )
        if epoch_samples is not None:
            raise ValueError(f"{epoch_samples=} sets a mixture's epoch size; pass a list of Source(...) to mix")
        return None, [os.fspath(dataset)]
    if shard_affinity is not None:
        raise ValueError(
            "shard_affinity='node' is not supported for a mixture yet (ShardDataset refuses it too); plan the "
            "mixture without it"
        )
    return sources, [os.fspath(src.location) for src in sources]  # type: ignore[arg-type]


def _table_bytes(locations: list[str], indexes: list[Any]) -> np.ndarray | None:
    """The sample tables' bytes of a local dataset (stat), shard by shard; None (estimated by
    :class:`Data`) for a remote one, one of over 200,000 shards, or a table missing."""
    if (
        not all(scheme_of(loc) is None for loc in locations)
        or sum(ix.num_shards for ix in indexes) > _STAT_TABLES_UP_TO
    ):
        return None
    try:
        return np.asarray(
            [
                os.path.getsize(os.path.join(ix.root, ix.manifest.table_name(i)))
                for ix in indexes
                for i in range(ix.num_shards)
            ],
            np.int64,
        )
    except OSError:  # a table missing or elsewhere: estimated
        return None


def time_open(dataset: Any, *, s3: Any, fetch: Any, epoch_samples: int | None, mix: str) -> float | None:
    """Seconds to make the job's ``ShardDataset`` here, the first store access of this process
    (its client made cold, the index read, the reader set up), as a rank opens it; imports
    first (start-up, not counted). None where it cannot be made here (torch missing)."""
    try:
        from ..dataset import ShardDataset
    except ImportError:
        return None
    sources = sources_of(dataset)
    import_client_library([os.fspath(s.location) for s in sources] if sources else [os.fspath(dataset)])
    kwargs = {"epoch_samples": epoch_samples, "mix": mix} if sources is not None else {}
    began = time.perf_counter()
    try:
        ShardDataset(dataset, s3=s3, fetch=fetch, shuffle=False, **kwargs)
    except Exception:  # noqa: BLE001 (the planner's own open raises what is wrong)
        return None
    return time.perf_counter() - began


def import_client_library(locations: list[str]) -> None:
    """Import an S3 store's client library (aiobotocore) now, so opening the index times the
    client's creation and the index GET, not the import (process start-up)."""
    if any(scheme_of(loc) == "s3" for loc in locations):
        try:
            import aiobotocore.config
            import aiobotocore.session  # noqa: F401
        except ImportError:  # opening the index says what is missing
            pass
