"""The shard writer: samples in, tar shards out, rotating on bytes and sample count."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from .format import END_OF_ARCHIVE, member_header, padded_size
from .index import MemberEntry, SampleEntry, ShardEntry
from .storage import ShardSink, Store

__all__ = ["ShardWriter", "shard_name"]


def shard_name(name: str, number: int) -> str:
    """``shard_name("data", 3)`` -> ``"data-000003.tar"``."""
    return f"{name}-{number:06d}.tar"


class ShardWriter:
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
        on_commit: called with each shard's index entry right after it is published.
    """

    def __init__(
        self,
        store: Store,
        *,
        shard_names: Callable[[int], str],
        max_shard_bytes: int,
        max_samples_per_shard: int | None = None,
        first_seq: int = 0,
        on_commit: Callable[[ShardEntry], None] | None = None,
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
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._samples: list[SampleEntry] = []

    def write_sample(self, key: str, members: Sequence[tuple[str, bytes]]) -> None:
        """Append one sample: ``members`` are ``(member_name, payload)`` sorted by name.

        May first publish the shard in progress (calling ``on_commit``) if the sample does
        not fit in it.
        """
        headers = [member_header(member_name, len(payload)) for member_name, payload in members]
        size = sum(len(h) + padded_size(len(p)) for h, (_, p) in zip(headers, members))
        if self._sink is not None and (
            self._bytes + size + len(END_OF_ARCHIVE) > self.max_shard_bytes
            or len(self._samples) == self.max_samples_per_shard
        ):
            self._finish_shard()
        if self._sink is None:
            self._sink = self.store.open_writer(self.shard_names(self.seq))
        entries = []
        for header, (member_name, payload) in zip(headers, members):
            self._write(header)
            entries.append(MemberEntry(member_name, self._bytes, len(payload)))
            self._write(payload)
            pad = padded_size(len(payload)) - len(payload)
            if pad:
                self._write(bytes(pad))
        self._samples.append(SampleEntry(key, tuple(entries)))

    def close(self) -> None:
        """Publish the shard in progress, if any."""
        if self._sink is not None:
            self._finish_shard()

    def abort(self) -> None:
        """Drop the shard in progress (published shards stay)."""
        if self._sink is not None:
            self._sink.abort()
            self._sink = None

    def _write(self, data: bytes) -> None:
        assert self._sink is not None  # internal: write_sample opened it
        self._sink.write(data)
        self._hash.update(data)
        self._bytes += len(data)

    def _finish_shard(self) -> None:
        self._write(END_OF_ARCHIVE)
        assert self._sink is not None
        self._sink.commit()
        entry = ShardEntry(
            name=self.shard_names(self.seq),
            bytes=self._bytes,
            sha256=self._hash.hexdigest(),
            samples=tuple(self._samples),
        )
        self._sink = None
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._samples = []
        self.seq += 1
        if self.on_commit is not None:
            self.on_commit(entry)
