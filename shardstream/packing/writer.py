"""The tar writer under every writing path: samples in, tar shards out, rotating on bytes and
sample count (the public :class:`shardstream.ShardWriter` and :func:`shardstream.pack_samples`
add the journal and the value encoding on top)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..format import END_OF_ARCHIVE, member_header, padded_size
from ..index import TableSpool
from ..storage import ShardSink, Store

__all__ = ["PublishedShard", "RotatingTarWriter"]

_ZEROS = bytes(512)


@dataclass(frozen=True)
class PublishedShard:
    """A shard just published, with its sample table spooled (not held as objects)."""

    name: str
    bytes: int
    crc32: str
    num_samples: int
    num_members: int
    table: TableSpool


class RotatingTarWriter:
    """Writes samples into tar shards of a store, publishing each when it is complete.

    A shard is closed before a sample that would push it past ``max_shard_bytes`` (headers,
    padding and the end-of-archive blocks included) or past ``max_samples_per_shard``; so a
    shard exceeds ``max_shard_bytes`` only when it holds a single sample that alone does.

    Args:
        store: where shards go.
        shard_names: the name of the shard with sequence number ``seq`` (0, 1, ...).
        max_shard_bytes: size limit of one shard file, in bytes (> 0).
        max_samples_per_shard: sample limit of one shard (> 0), or None for no limit.
        first_seq: sequence number of the first shard (> 0 when resuming).
        on_commit: called with each :class:`PublishedShard` right after it is published. The
            sample table of the shard in progress is spooled to temporary files, so memory
            does not grow with the samples per shard.
    """

    def __init__(
        self,
        store: Store,
        *,
        shard_names: Callable[[int], str],
        max_shard_bytes: int,
        max_samples_per_shard: int | None = None,
        first_seq: int = 0,
        on_commit: Callable[[PublishedShard], None] | None = None,
    ) -> None:
        if max_shard_bytes <= 0:
            raise ValueError(f"{max_shard_bytes=} must be > 0")
        if max_samples_per_shard is not None and max_samples_per_shard <= 0:
            raise ValueError(f"{max_samples_per_shard=} must be > 0 (or None for no limit)")
        self.store = store
        self.shard_names = shard_names
        self.max_shard_bytes = max_shard_bytes
        self.max_samples_per_shard = max_samples_per_shard
        self.seq = first_seq
        self.on_commit = on_commit
        self._sink: ShardSink | None = None
        self._crc32 = 0
        self._bytes = 0
        self._num_samples = 0
        self._num_members = 0
        self._table = TableSpool(self.shard_names(self.seq))

    def write_sample(self, key: str, members: Sequence[tuple[str, bytes]]) -> None:
        """Append one sample: ``members`` are ``(member_name, payload)`` sorted by name.

        May first publish the shard in progress (calling ``on_commit``) if the sample does
        not fit in it.
        """
        headers = [member_header(member_name, len(payload)) for member_name, payload in members]
        size = sum(len(h) + padded_size(len(p)) for h, (_, p) in zip(headers, members))
        if self._sink is not None and (
            self._bytes + size + len(END_OF_ARCHIVE) > self.max_shard_bytes
            or self._num_samples == self.max_samples_per_shard
        ):
            self._finish_shard()
        if self._sink is None:
            self._sink = self.store.open_writer(self.shard_names(self.seq))
        entries = []
        pieces: list[bytes] = []
        offset = self._bytes
        for header, (member_name, payload) in zip(headers, members):
            entries.append((member_name, offset + len(header), len(payload)))
            pad = padded_size(len(payload)) - len(payload)
            pieces += (header, payload, _ZEROS[:pad]) if pad else (header, payload)
            offset += len(header) + len(payload) + pad
        self._write(pieces)
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
        self._table = TableSpool(self.shard_names(self.seq))

    def close(self) -> None:
        """Publish the shard in progress, if any."""
        if self._sink is not None:
            self._finish_shard()

    def abort(self) -> None:
        """Drop the shard in progress (published shards stay)."""
        if self._sink is not None:
            self._sink.abort()
            self._sink = None

    def _write(self, pieces: Sequence[bytes]) -> None:
        """Write ``pieces`` in order, with one system call for a local shard."""
        assert self._sink is not None  # internal: write_sample opened it
        write_many = getattr(self._sink, "write_many", None)
        if write_many is not None:
            write_many(pieces)
        else:
            for piece in pieces:
                self._sink.write(piece)
        for piece in pieces:
            self._crc32 = zlib.crc32(piece, self._crc32)
            self._bytes += len(piece)

    def _finish_shard(self) -> None:
        self._write([END_OF_ARCHIVE])
        assert self._sink is not None
        self._sink.commit()
        published = PublishedShard(
            name=self.shard_names(self.seq),
            bytes=self._bytes,
            crc32=f"{self._crc32:08x}",
            num_samples=self._num_samples,
            num_members=self._num_members,
            table=self._table,
        )
        self._sink = None
        self._crc32 = 0
        self._bytes = 0
        self._num_samples = self._num_members = 0
        self.seq += 1
        self._table = TableSpool(self.shard_names(self.seq))
        try:
            if self.on_commit is not None:
                self.on_commit(published)
        finally:
            published.table.close()
