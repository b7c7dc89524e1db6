"""A Ray Data datasink: a Ray Dataset of samples -> tar shards plus an index, written by the
cluster's tasks in parallel (``pip install 'shardstream[ray]'``; nothing else in shardstream
imports ray)::

    from shardstream.packing.ray_sink import ShardDatasink

    sink = ShardDatasink("s3://bucket/ds", max_shard_bytes=256 << 20)
    dataset.write_datasink(sink)  # dataset: rows {"__key__": ..., "jpg": ..., "cls": ...}
    print(sink.totals)            # {"num_shards": ..., "num_samples": ..., ...}

Each write task writes its rows, in order, through the same tar writer as ``pack`` and
:class:`shardstream.ShardWriter`, which publishes each shard and its sample table as it does
for them; the driver checks and claims ``dest`` with their destination checks
(:mod:`shardstream.packing.destination`), then writes ``index.bin`` from every task's shards'
manifest rows (by task, then sequence number) as the journal's merge does.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import DestinationError, MissingDependencyError, SourceError
from ..index import KEYS_DIR, MANIFEST_NAME, TABLE_SUFFIX
from ..storage import Store, is_remote_url
from .destination import DEFAULT_MAX_SHARD_BYTES, check_destination, check_options, open_destination, wipe
from .encode import JPEG_QUALITY, encode_sample
from .journal import SPEC_NAME, STATE_DIR
from .merge import ManifestColumns
from .ownership import SINK_RECORDS, foreign_names, recorded_names, refuse_foreign
from .writer import RotatingTarWriter, ShardLimits

try:
    from ray.data import Datasink
    from ray.data.block import BlockAccessor
except ImportError as exc:  # pragma: no cover - the extra is installed wherever this is tested
    raise MissingDependencyError("shardstream.packing.ray_sink needs Ray Data: pip install 'shardstream[ray]'") from exc

__all__ = ["ShardDatasink"]

logger = logging.getLogger(__name__)

ManifestRow = dict[str, Any]  # name, bytes, num_samples, num_members, crc32 (8 hex digits)


class ShardDatasink(Datasink):
    """Writes a Ray Dataset of samples as tar shards plus an index at ``dest``:
    ``dataset.write_datasink(ShardDatasink(dest))``.

    Rows are samples, as :class:`shardstream.ShardWriter` takes them: ``"__key__"`` (a str,
    by ``pack``'s key rules) and one column per member extension (``"jpg"``, ``"cls"``,
    ``"json"``, ``"seg.png"``, ...), whose values become member bytes by
    :mod:`shardstream.packing.encode` (bytes as they are, ``str`` as UTF-8, ints and floats as
    decimal text, anything under ``json`` as JSON, numpy arrays under ``npy``, PIL images under
    an image extension). numpy scalars count as the Python values they hold. A column whose
    value is None in a row (what Arrow gives a row that lacked a column other rows have) is no
    member of that sample. A ``dict`` under ``json`` passes through Arrow as a struct, whose
    fields are those of every row (missing ones None): give JSON as a ``str`` where rows differ.

    What it writes:

    - write task ``T`` (Ray's task index) writes its rows, in the order it gets them, into
      shards ``NAME-TTTTTT-SSSSSS.tar`` (``S`` = 0, 1, ... per task), each published
      atomically and closed before a sample would take it past ``max_shard_bytes`` or
      ``max_samples_per_shard``, each with its sample table ``NAME-TTTTTT-SSSSSS.tar.samples``;
      a task that Ray runs again writes the same names again; each shard is recorded as the
      sink's (an empty ``.shardstream/sink/NAME-TTTTTT-SSSSSS.tar``) right after it is
      published, so a later ``overwrite`` deletes those shards and nothing else (the records
      are removed once ``index.bin``, which records the shards, is written);
    - when every task succeeded, ``index.bin`` (on the driver), listing the shards by task,
      then sequence number; :attr:`totals` then holds its totals.

    The result reads like ``pack``'s: ``ShardDataset(dest)``, exact epochs over ranks,
    ``shardstream verify``. A write that fails leaves whole shards and no index; a later
    write to ``dest`` refuses to start unless ``overwrite=True``. A local ``dest`` must be
    the same directory on every node (a shared file system); relative paths are taken
    relative to the driver's working directory.

    Args:
        dest: a local directory (created if needed) or a writable store URL (``s3://``,
            ``gs://``, ``az://``).
        name: shard name prefix.
        max_shard_bytes: shard size limit in bytes (exceeded only by a single larger sample).
        max_samples_per_shard: sample limit per shard, or None.
        overwrite: replace what ``dest`` holds (a dataset, an unfinished pack or write): only
            what its index, pack state or the sink's records name.
        clobber: write over files at ``dest`` with the names this sink writes (its shards and
            tables, ``index.bin``, ``keys/``, ``.shardstream/sink/``) that nothing there records;
            without it such a ``dest`` is refused, naming them.
        s3, fetch: endpoint, credentials and multipart settings for ``s3://`` (sent to
            every write task).
        requests: timeouts, attempts and connections of the store's requests
            (:class:`~shardstream.config.RequestConfig`; None: its defaults).
        jpeg_quality: quality of PIL images saved as JPEG (1-95).

    Attributes:
        totals: after a successful write, ``index.bin``'s totals: ``num_shards``,
            ``num_samples``, ``num_members``, ``bytes`` (all shard bytes); else None.

    Raises (from ``write_datasink``; Ray wraps errors of write tasks in a ``RayTaskError``
    that is also an instance of the original type):
        ValueError: bad options (at construction).
        DestinationError: ``dest`` holds a dataset, an unfinished pack or shards of a write
            that failed, and not ``overwrite``; or ``dest`` cannot be written.
        TypeError, ValueError: a bad row: no or a bad ``__key__``, a value its extension
            cannot hold, a key repeating the one before it (names the key and the field).
        SourceError: the dataset has no rows (nothing is left at ``dest``).
        StorageError: the store failed (names the URL).
    """

    def __init__(
        self,
        dest: str | os.PathLike[str],
        *,
        name: str = "data",
        max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
        max_samples_per_shard: int | None = None,
        overwrite: bool = False,
        clobber: bool = False,
        s3: S3Config | None = None,
        requests: RequestConfig | None = None,
        fetch: FetchConfig | None = None,
        jpeg_quality: int = JPEG_QUALITY,
    ) -> None:
        check_options(name, max_shard_bytes, max_samples_per_shard, jpeg_quality=jpeg_quality)
        text = os.fspath(dest)
        if not is_remote_url(text):  # write tasks run in other working directories
            text = str(Path(text.removeprefix("file://")).expanduser().absolute())
        self.dest = text
        self.name = name
        self.max_shard_bytes = max_shard_bytes
        self.max_samples_per_shard = max_samples_per_shard
        self.overwrite = overwrite
        self.clobber = clobber
        self.s3 = s3
        self.requests = requests
        self.fetch = fetch
        self.jpeg_quality = jpeg_quality
        self.totals: dict[str, int] | None = None
        self._store: Store | None = None  # the driver's; write tasks open their own
        self._own = re.compile(re.escape(name) + r"-(\d{6,})-(\d{6,})\.tar(?:" + re.escape(TABLE_SUFFIX) + ")?")

    def __repr__(self) -> str:
        return f"ShardDatasink({self.dest!r}, name={self.name!r}, max_shard_bytes={self.max_shard_bytes})"

    def __getstate__(self) -> dict[str, Any]:
        """What a write task gets: the options, not the driver's store."""
        state = self.__dict__.copy()
        state["_store"] = None
        return state

    def shard_name(self, task_idx: int, seq: int) -> str:
        """The name of write task ``task_idx``'s shard number ``seq``."""
        return f"{self.name}-{task_idx:06d}-{seq:06d}.tar"

    # ------------------------------------------------------------------------ the driver

    def _open(self) -> Store:
        if self._store is None:
            self._store = open_destination(self.dest, s3=self.s3, fetch=self.fetch, requests=self.requests)
        return self._store

    def on_write_start(self, schema: Any = None) -> None:
        """Check ``dest`` before any task writes (on the driver).

        Raises:
            DestinationError: ``dest`` cannot be written, or holds a dataset (an index), an
                unfinished ``pack`` or shards of a write that failed, and not ``overwrite``
                (then they are deleted first).
        """
        store = self._open()
        old_spec, index = check_destination(store)
        self.totals = None
        leftovers = store.list_names(SINK_RECORDS)
        recorded: set[str] = set()
        if not self.overwrite:
            what = None
            if index is not None:
                what = f"a dataset ({store.url_of(index)})"
            elif old_spec is not None:
                what = f"an unfinished pack ({store.url_of(SPEC_NAME)})"
            elif leftovers:
                shard = leftovers[0].removeprefix(SINK_RECORDS)
                what = f"shards of a ShardDatasink write that failed ({store.url_of(shard)}, ...)"
            if what is not None:
                raise DestinationError(
                    f"{store.url} already holds {what}; pass ShardDatasink(..., overwrite=True) to replace it, "
                    "or pick another dest"
                )
        else:
            recorded = recorded_names(store)
        if not self.clobber:
            foreign = foreign_names(store, self._writes, recorded, name=self.name)
            refuse_foreign(store, foreign, option="ShardDatasink(..., clobber=True)", what="this ShardDatasink")
        if self.overwrite:
            wipe(store, old_spec, recorded=recorded)
            store.remove_empty_dirs((SINK_RECORDS.rstrip("/"), STATE_DIR))
        store.remove_partials(lambda n: self._own.fullmatch(n) is not None or n == MANIFEST_NAME)

    def _writes(self, name: str) -> bool:
        """Whether this sink writes ``name``: its shards and tables, the index, the key index,
        its records."""
        return (
            self._own.fullmatch(name) is not None
            or name == MANIFEST_NAME
            or name.startswith((f"{KEYS_DIR}/", SINK_RECORDS))
        )

    def on_write_complete(self, write_result: Any) -> None:
        """Write ``index.bin`` from every task's shards (on the driver, once all succeeded)
        and set :attr:`totals`.

        ``write_result`` is Ray's ``WriteResult``; its ``write_returns`` hold what each
        task's :meth:`write` returned, in no particular order.

        Raises:
            SourceError: no sample was written.
            RuntimeError: two tasks returned the same shard (a Ray bug).
        """
        rows = [row for returned in write_result.write_returns for row in (returned or ())]
        store = self._open()
        if not rows:
            raise SourceError(f"{store.url}: the Ray Dataset has no rows; nothing was written there")
        rows.sort(key=self._order)
        names = [row["name"] for row in rows]
        if len(set(names)) != len(names):
            raise RuntimeError(f"{store.url}: write tasks returned a shard twice: {sorted(names)}")
        columns = ManifestColumns()
        for row in rows:
            columns.add(row, url=store.url)
        self.totals = columns.write(store)
        for record in store.list_names(SINK_RECORDS):  # the index records the shards now
            store.delete(record)
        store.remove_empty_dirs((SINK_RECORDS.rstrip("/"), STATE_DIR))

    def on_write_failed(self, error: Exception) -> None:
        """Say what a failed write left (whole shards, no index)."""
        logger.warning(
            "ShardDatasink(%s): the write failed (%s); shards written so far stay there without an index; "
            "write again with overwrite=True",
            self.dest,
            type(error).__name__,
        )

    def _order(self, row: ManifestRow) -> tuple[int, int]:
        """(task index, sequence number) of a shard this sink named."""
        match = self._own.fullmatch(row["name"])
        if match is None:
            raise RuntimeError(f"{self.dest}: a write task returned a shard not named by this sink: {row['name']!r}")
        return int(match.group(1)), int(match.group(2))

    # -------------------------------------------------------------------- a write task

    def write(self, blocks: Iterable[Any], ctx: Any) -> list[ManifestRow]:
        """Write the rows of ``blocks`` into shards of task ``ctx.task_idx`` (in a Ray task).

        Returns:
            The manifest rows of the shards written, in order: ``name``, ``bytes`` (the
            shard file's size), ``num_samples``, ``num_members``, ``crc32`` (8 hex digits).

        Raises:
            TypeError, ValueError: a bad row (names the key and the field); the shard in
                progress is dropped, those published stay.
            StorageError: the store failed.
        """
        task = int(ctx.task_idx)
        written: list[ManifestRow] = []
        store = open_destination(self.dest, s3=self.s3, fetch=self.fetch, requests=self.requests)

        def record(published: Any) -> None:
            store.write_bytes(SINK_RECORDS + published.name, b"")  # the sink's own: overwrite may delete it
            written.append(published.row)

        with RotatingTarWriter(
            store,
            shard_names=lambda seq: self.shard_name(task, seq),
            limits=ShardLimits(self.max_shard_bytes, self.max_samples_per_shard),
            on_commit=record,
        ) as writer:
            last_key = None
            for block in blocks:
                for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                    key, members = self._encode(row, task)
                    if key == last_key:
                        raise ValueError(
                            f"{self.dest}, write task {task}: sample key {key!r} repeats the key of the row "
                            "before it; readers would join the two into one sample: give every row its own key"
                        )
                    writer.write_sample(key, members)
                    last_key = key
            writer.close()
        return written

    def _encode(self, row: Any, task: int) -> tuple[str, list[tuple[str, bytes]]]:
        """A row -> (key, members); a bad row's TypeError / ValueError names dest and task."""
        sample = {field: _plain(value) for field, value in row.items() if value is not None}
        try:
            return encode_sample(sample, jpeg_quality=self.jpeg_quality)
        except (TypeError, ValueError) as exc:
            if type(exc) not in (TypeError, ValueError):  # a subclass may take other arguments
                raise
            raise type(exc)(f"{self.dest}, write task {task}: {exc}") from exc


def _plain(value: Any) -> Any:
    """A numpy scalar (what some blocks hold for a cell) as the Python value it holds."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()
    return value
