"""The tar writer under every writing path: samples in, tar shards out, each shard published
with its sample table (:meth:`RotatingTarWriter._publish`, the one publish path of ``pack``,
:class:`shardstream.ShardWriter`, :func:`shardstream.pack_samples` and the Ray datasink, which
add the journal and the value encoding on top); and :class:`ShardLimits`, the one rule for
where a shard ends, which the listing's plan (:mod:`.listing`) applies too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..format import BLOCK_BYTES, END_OF_ARCHIVE, member_header
from ..index import TABLE_SUFFIX, TableSpool
from ..storage import ShardSink, Store, write_pieces

try:  # ISA-L's CRC-32: the values of zlib.crc32, several times faster
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib where it is absent
    from zlib import crc32

__all__ = ["AbortsOnError", "PublishedShard", "RotatingTarWriter", "ShardLimits"]

_ZEROS = bytes(BLOCK_BYTES)
_BLOCK_MASK = BLOCK_BYTES - 1
_FLUSH_BYTES = 1 << 20  # a local shard's pieces are written in runs of about this many bytes
_FLUSH_PIECES = 768  # ... or of this many pieces (writev takes up to IOV_MAX, 1024)


@dataclass(frozen=True)
class ShardLimits:
    """Where a shard ends: before a sample that would push it past ``max_shard_bytes``
    (headers, padding and the end-of-archive blocks included) or past ``max_samples_per_shard``
    samples; so a shard exceeds ``max_shard_bytes`` only when it holds a single sample that
    alone does.

    Raises:
        ValueError: a limit is not > 0.
    """

    max_shard_bytes: int
    max_samples_per_shard: int | None = None

    def __post_init__(self) -> None:
        if self.max_shard_bytes <= 0:
            raise ValueError(f"max_shard_bytes={self.max_shard_bytes!r} must be > 0")
        if self.max_samples_per_shard is not None and self.max_samples_per_shard <= 0:
            raise ValueError(f"max_samples_per_shard={self.max_samples_per_shard!r} must be > 0 (or None for no limit)")

    def ends_before(self, shard_bytes: int, shard_samples: int, sample_bytes: int) -> bool:
        """Whether a shard holding ``shard_samples`` samples in ``shard_bytes`` bytes ends
        before a sample of ``sample_bytes`` (its members' headers and padded payloads); an
        empty shard takes any sample."""
        return shard_samples > 0 and (
            shard_bytes + sample_bytes + len(END_OF_ARCHIVE) > self.max_shard_bytes
            or shard_samples == self.max_samples_per_shard
        )


@dataclass(frozen=True)
class PublishedShard:
    """A shard just published, with its sample table: what its manifest row holds."""

    name: str
    bytes: int
    crc32: str
    num_samples: int
    num_members: int

    @property
    def row(self) -> dict[str, Any]:
        """Its manifest row, as the journal records it and the index is built from it:
        name, bytes, num_samples, num_members, crc32 (8 hex digits)."""
        return {
            "name": self.name,
            "bytes": self.bytes,
            "num_samples": self.num_samples,
            "num_members": self.num_members,
            "crc32": self.crc32,
        }


_Writer = TypeVar("_Writer", bound="AbortsOnError")


class AbortsOnError:
    """A writer that, used as a context manager, drops its shard in progress (:meth:`abort`)
    when the block raises; what it published stays."""

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Writer) -> _Writer:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is not None:
            self.abort()


class RotatingTarWriter(AbortsOnError):
    """Writes samples into tar shards of a store, publishing each when it is complete.

    Args:
        store: where shards go.
        shard_names: the name of the shard with sequence number ``seq`` (0, 1, ...).
        limits: where a shard ends (:class:`ShardLimits`); None: only where the caller says,
            by :meth:`close` (a listed pack's planned shards).
        first_seq: sequence number of the first shard (> 0 when resuming).
        on_commit: called with each :class:`PublishedShard` right after it and its sample
            table are published. The sample table of the shard in progress is spooled to
            temporary files, so memory does not grow with the samples per shard.

    As a context manager, it drops the shard in progress when the block raises.
    """

    def __init__(
        self,
        store: Store,
        *,
        shard_names: Callable[[int], str],
        limits: ShardLimits | None,
        first_seq: int = 0,
        on_commit: Callable[[PublishedShard], None] | None = None,
    ) -> None:
        self.store = store
        self.shard_names = shard_names
        self.limits = limits
        self.seq = first_seq
        self.on_commit = on_commit
        self._sink: ShardSink | None = None
        self._table: TableSpool
        self._next_shard()

    def write_sample(self, key: str, members: Sequence[tuple[str, bytes]]) -> None:
        """Append one sample: ``members`` are ``(member_name, payload)`` sorted by name.

        May first publish the shard in progress (calling ``on_commit``) if the sample does
        not fit in it.
        """
        pieces: list[bytes] = []
        starts = []  # each payload's offset in the sample
        offset = 0
        for member_name, payload in members:
            length = len(payload)
            header = member_header(member_name, length)
            pad = -length & _BLOCK_MASK
            starts.append(offset + len(header))
            if pad:
                pieces += (header, payload, _ZEROS[:pad])
            else:
                pieces += (header, payload)
            offset += len(header) + length + pad
        size = offset
        limits = self.limits
        if self._sink is not None and limits is not None and limits.ends_before(self._bytes, self._num_samples, size):
            self._publish()
        if self._sink is None:
            self._sink = self.store.open_writer(self.shard_names(self.seq))
            self._write_many = getattr(self._sink, "write_many", None)
        base = self._bytes  # where the sample starts in its shard
        entries = [(name, base + start, len(payload)) for (name, payload), start in zip(members, starts)]
        self._write(pieces, size)
        self._table.add(key, entries)
        self._num_samples += 1
        self._num_members += len(entries)

    @property
    def in_progress(self) -> bool:
        """Whether a shard is open (a sample was written since the last one was published)."""
        return self._sink is not None

    def skip(self) -> None:
        """Move to the next sequence number without publishing a shard (a planned shard whose
        every input was skipped)."""
        if self._sink is not None:
            raise RuntimeError("skip() with a shard in progress; close() it first")
        self._table.close()
        self.seq += 1
        self._next_shard()

    def close(self) -> None:
        """Publish the shard in progress, if any."""
        if self._sink is not None:
            self._publish()

    def abort(self) -> None:
        """Drop the shard in progress (published shards stay)."""
        self._pending = []
        if self._sink is not None:
            self._sink.abort()
            self._sink = None

    def _write(self, pieces: Sequence[bytes], size: int) -> None:
        """Write ``pieces`` (``size`` bytes in all) in order: a local shard's gather in runs
        written with one system call each (:meth:`_flush`), others' go out at once."""
        assert self._sink is not None  # internal: write_sample opened it
        for piece in pieces:
            self._crc32 = crc32(piece, self._crc32)
        self._bytes += size
        if self._write_many is None:
            for piece in pieces:
                self._sink.write(piece)
            return
        self._pending += pieces
        self._pending_bytes += size
        if self._pending_bytes >= _FLUSH_BYTES or len(self._pending) >= _FLUSH_PIECES:
            self._flush()

    def _flush(self) -> None:
        """Write the pieces gathered for a local shard (one ``writev``)."""
        if self._pending:
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            assert self._write_many is not None
            self._write_many(pending)

    def _next_shard(self) -> None:
        """Start shard number ``seq`` afresh (opened by its first sample)."""
        self._sink = None
        self._write_many: Callable[[Sequence[bytes]], None] | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._crc32 = self._bytes = self._num_samples = self._num_members = 0
        self._table = TableSpool(self.shard_names(self.seq))

    def _publish(self) -> None:
        """Publish the shard in progress (its upload completes, or its temporary file is
        renamed into place), then its sample table (streamed from its spool), then call
        ``on_commit``: how every writer publishes a shard."""
        self._write([END_OF_ARCHIVE], len(END_OF_ARCHIVE))
        self._flush()
        assert self._sink is not None
        self._sink.commit()
        published = PublishedShard(
            name=self.shard_names(self.seq),
            bytes=self._bytes,
            crc32=f"{self._crc32:08x}",
            num_samples=self._num_samples,
            num_members=self._num_members,
        )
        table = self._table
        self.seq += 1
        self._next_shard()
        try:
            write_pieces(self.store, published.name + TABLE_SUFFIX, table.pieces())
            if self.on_commit is not None:
                self.on_commit(published)
        finally:
            table.close()
