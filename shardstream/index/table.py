"""Per-shard sample tables, ``NAME.samples`` beside shard ``NAME``: its samples' keys and
members (names, payload offsets and sizes), as numeric columns (container: :mod:`.container`).

Read only where the per-sample layout is needed: a shard cut at a rank or worker boundary
(byte ranges), ``verify``, ``index --dali``. Header fields: ``format`` ("shardstream-table"),
``version`` (2), ``shard`` (its name), ``num_samples``, ``num_members``. Columns:

================  =====  ===============================================================
``member_start``  int64  ``num_samples + 1``: sample ``i``'s members are rows
                         ``member_start[i]`` to ``member_start[i + 1]``
``offsets``       int64  where each member's payload starts in the shard (its header ends)
``sizes``         int64  each member's payload length
``key_offsets``   int64  ``num_samples + 1`` offsets into ``keys``
``keys``          uint8  the samples' keys, UTF-8, concatenated
``name_offsets``  int64  ``num_members + 1`` offsets into ``names``
``names``         uint8  the members' names (paths), UTF-8, concatenated
================  =====  ===============================================================

``shard[offset:offset + size]`` is the original file. :class:`TableSpool` writes a table while
a shard is packed, with memory flat in its number of samples.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from . import container

__all__ = ["ShardTable", "TableSpool"]

FORMAT = "shardstream-table"
VERSION = 2
MAGIC = b"SSTABLE\x00"
_SPOOL_SAMPLES = 4096  # samples a TableSpool holds as Python values before writing them to its files
_COLUMNS = {
    "member_start": "<i8",
    "offsets": "<i8",
    "sizes": "<i8",
    "key_offsets": "<i8",
    "keys": "|u1",
    "name_offsets": "<i8",
    "names": "|u1",
}


class ShardTable:
    """One shard's samples (module doc).

    Attributes:
        shard: the shard's name; url: where the table was read (named in errors).
        member_start, offsets, sizes: int64 arrays (see the module doc).
    """

    def __init__(self, *, shard: str, url: str, columns: dict[str, np.ndarray]) -> None:
        self.shard, self.url = shard, url
        self.member_start, self.offsets, self.sizes = columns["member_start"], columns["offsets"], columns["sizes"]
        self._key_offsets, self._keys = columns["key_offsets"], columns["keys"]
        self._name_offsets, self._names = columns["name_offsets"], columns["names"]

    def __repr__(self) -> str:
        return f"ShardTable({self.shard!r}, num_samples={self.num_samples}, num_members={self.num_members})"

    @property
    def num_samples(self) -> int:
        return len(self.member_start) - 1

    @property
    def num_members(self) -> int:
        return len(self.offsets)

    def key(self, i: int) -> str:
        return self._text(self._keys, self._key_offsets, i, "key")

    def keys(self) -> list[str]:
        """Every sample's key, in shard order."""
        return self._texts(self._keys, self._key_offsets, "key")

    def member_names(self) -> list[str]:
        return self._texts(self._names, self._name_offsets, "member name")

    def sample_ends(self) -> np.ndarray:
        """int64 ``(num_samples,)``: the byte where each sample ends (its last payload's
        padding included; the next sample's headers start there)."""
        last = self.member_start[1:] - 1
        return self.offsets[last] + (self.sizes[last] + 511) // 512 * 512

    def samples(self) -> Iterator[tuple[str, list[tuple[str, int, int]]]]:
        """``(key, [(member name, offset, size), ...])`` per sample, in shard order."""
        names = self.member_names()
        starts = self.member_start.tolist()
        offsets, sizes = self.offsets.tolist(), self.sizes.tolist()
        for i, key in enumerate(self.keys()):
            rows = range(starts[i], starts[i + 1])
            yield key, [(names[j], offsets[j], sizes[j]) for j in rows]

    def _text(self, blob: np.ndarray, offsets: np.ndarray, i: int, what: str) -> str:
        try:
            return blob[offsets[i] : offsets[i + 1]].tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IndexFormatError(f"{self.url}: {what} {i} is not UTF-8 ({exc})") from exc

    def _texts(self, blob: np.ndarray, offsets: np.ndarray, what: str) -> list[str]:
        try:
            text = blob.tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IndexFormatError(f"{self.url}: a {what} is not UTF-8 ({exc})") from exc
        if text.isascii():
            bounds = offsets.tolist()
            return [text[a:b] for a, b in itertools.pairwise(bounds)]
        return [self._text(blob, offsets, i, what) for i in range(len(offsets) - 1)]

    def name_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(names, name_offsets)``: every member name, UTF-8, concatenated (uint8), and the
        ``num_members + 1`` int64 offsets into it (views of the table, no copy)."""
        return self._names, self._name_offsets

    @functools.cached_property
    def extensions(self) -> tuple[str, ...] | None:
        """The extensions of every sample's members, in member order, when all samples have
        the same ones (nearly every dataset: ``("cls", "jpg")``); None when they differ.
        Found with numpy over the name bytes, once per table."""
        n, m = self.num_samples, self.num_members
        if n == 0 or m % n or (np.diff(self.member_start) != m // n).any():
            return None
        k = m // n
        starts, ends = self._extension_bounds()
        starts, lengths = starts.reshape(n, k), (ends - starts).reshape(n, k)
        if (lengths != lengths[0]).any():
            return None
        names = self._names
        exts = []
        for p in range(k):
            length = int(lengths[0, p])
            rows = names[starts[:, p, None] + np.arange(length)] if length else np.zeros((n, 0), np.uint8)
            if (rows != rows[0]).any():
                return None
            exts.append(self._text(rows[0], np.array([0, length]), 0, "member name"))
        return tuple(exts)

    @functools.cached_property
    def member_extensions(self) -> list[str]:
        """Each member's extension (what follows its sample's key and a dot), in table order."""
        keys = self.keys()
        starts = self.member_start.tolist()
        names = self.member_names()
        out: list[str] = []
        for i, key in enumerate(keys):
            cut = len(key) + 1
            out.extend(name[cut:] for name in names[starts[i] : starts[i + 1]])
        return out

    def _extension_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``(num_members,)`` each: where each member's extension starts and ends in the
        name bytes (empty for a name without one: the name is the key)."""
        counts = np.diff(self.member_start)
        key_lengths = np.repeat(np.diff(self._key_offsets), counts)
        ends = self._name_offsets[1:]
        starts = np.minimum(self._name_offsets[:-1] + key_lengths + 1, ends)
        return starts, ends

    def pieces(self) -> Iterator[bytes]:
        fields = {
            "format": FORMAT,
            "version": VERSION,
            "shard": self.shard,
            "num_samples": self.num_samples,
            "num_members": self.num_members,
        }
        return container.to_pieces(
            MAGIC,
            fields,
            [
                ("member_start", self.member_start),
                ("offsets", self.offsets),
                ("sizes", self.sizes),
                ("key_offsets", self._key_offsets),
                ("keys", self._keys),
                ("name_offsets", self._name_offsets),
                ("names", self._names),
            ],
        )

    @classmethod
    def from_samples(
        cls, shard: str, samples: Iterable[tuple[str, Iterable[tuple[str, int, int]]]], *, url: str = ""
    ) -> ShardTable:
        """A table held in memory from ``(key, [(member name, offset, size), ...])`` per sample."""
        spool = TableSpool(shard)
        try:
            for key, members in samples:
                spool.add(key, list(members))
            return cls.parse(b"".join(spool.pieces()), url=url or shard + ".samples")
        finally:
            spool.close()

    @classmethod
    def parse(
        cls, buffer: Any, *, url: str, num_samples: int | None = None, num_members: int | None = None
    ) -> ShardTable:
        """A table from its file's bytes (views, no copy), validated.

        Args:
            num_samples, num_members: what the manifest says, checked when given.

        Raises:
            IndexFormatError: not a table, another version, columns that disagree with each
                other or with the manifest, or offsets outside the shard's order.
        """
        fields, columns = container.read(buffer, magic=MAGIC, url=url, kind="sample table")
        if fields.get("format") != FORMAT or fields.get("version") != VERSION:
            raise IndexFormatError(f"{url}: sample table version {fields.get('version')!r} is not supported")
        for name, dtype in _COLUMNS.items():
            if name not in columns or columns[name].dtype.str != dtype:
                raise IndexFormatError(f"{url}: column {name!r} missing or not {dtype}; re-run shardstream pack")
        table = cls(shard=str(fields.get("shard")), url=url, columns=columns)
        n, m = table.num_samples, table.num_members
        starts = table.member_start
        problem = None
        if n < 0 or fields.get("num_samples") != n or fields.get("num_members") != m:
            problem = "counts disagree with the header"
        elif (num_samples is not None and n != num_samples) or (num_members is not None and m != num_members):
            problem = f"{n} samples and {m} members, but the index says {num_samples} and {num_members}"
        elif len(table.sizes) != m or len(table._key_offsets) != n + 1 or len(table._name_offsets) != m + 1:
            problem = "columns of different lengths"
        elif starts[0] != 0 or starts[-1] != m or (np.diff(starts) < 1).any():
            problem = "bad member_start"
        elif (
            (table._key_offsets[:1] != 0).any()
            or table._key_offsets[-1] != len(table._keys)
            or (np.diff(table._key_offsets) < 0).any()
        ):
            problem = "bad key offsets"
        elif (
            (table._name_offsets[:1] != 0).any()
            or table._name_offsets[-1] != len(table._names)
            or (np.diff(table._name_offsets) < 1).any()
        ):
            problem = "bad member name offsets"
        elif m and ((table.sizes < 0).any() or (table.offsets[1:] < table.offsets[:-1] + table.sizes[:-1]).any()):
            problem = "members overlap or are out of order"
        if problem is not None:
            raise IndexFormatError(f"{url}: {problem}; the table is damaged or stale, re-run shardstream pack")
        return table


class TableSpool:
    """A table written sample by sample while its shard is packed: columns go to temporary
    files (in memory up to a few MiB each), so memory stays flat however many samples a shard
    holds. :meth:`pieces` gives the table file; :meth:`close` frees the spool."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        self.num_samples = 0
        self.num_members = 0
        self._files = {
            name: _spool() for name in ("counts", "offsets", "sizes", "key_lengths", "keys", "name_lengths", "names")
        }
        self._keys_bytes = self._names_bytes = 0
        self._pending: dict[str, list[Any]] = {name: [] for name in self._files}  # added, not yet spooled

    def add(self, key: str, members: list[tuple[str, int, int]]) -> None:
        """One sample: its key and ``(member name, payload offset, payload size)`` in order."""
        pending = self._pending
        encoded_key = key.encode("utf-8")
        pending["counts"].append(len(members))
        pending["key_lengths"].append(len(encoded_key))
        pending["keys"].append(encoded_key)
        for name, offset, size in members:
            encoded = name.encode("utf-8")
            pending["offsets"].append(offset)
            pending["sizes"].append(size)
            pending["name_lengths"].append(len(encoded))
            pending["names"].append(encoded)
            self._names_bytes += len(encoded)
        self.num_samples += 1
        self.num_members += len(members)
        self._keys_bytes += len(encoded_key)
        if len(pending["counts"]) >= _SPOOL_SAMPLES:
            self._flush()

    def _flush(self) -> None:
        """Write the samples added since the last flush to the spool files, a column at a time."""
        for name, values in self._pending.items():
            if values:
                data = b"".join(values) if name in ("keys", "names") else np.array(values, dtype="<i8").tobytes()
                self._files[name].write(data)
                values.clear()

    def pieces(self) -> Iterator[bytes]:
        """The table file's bytes, in pieces of at most a few MiB."""
        self._flush()
        n, m = self.num_samples, self.num_members
        fields = {"format": FORMAT, "version": VERSION, "shard": self.shard, "num_samples": n, "num_members": m}
        head, placement = container.layout(
            MAGIC,
            fields,
            [
                ("member_start", "<i8", n + 1),
                ("offsets", "<i8", m),
                ("sizes", "<i8", m),
                ("key_offsets", "<i8", n + 1),
                ("keys", "|u1", self._keys_bytes),
                ("name_offsets", "<i8", m + 1),
                ("names", "|u1", self._names_bytes),
            ],
        )
        yield head
        position = len(head)
        sources = [
            self._cumulative("counts"),
            self._copy("offsets"),
            self._copy("sizes"),
            self._cumulative("key_lengths"),
            self._copy("keys"),
            self._cumulative("name_lengths"),
            self._copy("names"),
        ]
        for (offset, nbytes), source in zip(placement, sources):
            if offset > position:
                yield bytes(offset - position)
            yield from source
            position = offset + nbytes

    def close(self) -> None:
        for f in self._files.values():
            f.close()

    def _copy(self, name: str) -> Iterator[bytes]:
        f = self._files[name]
        f.seek(0)
        while piece := f.read(4 << 20):
            yield piece

    def _cumulative(self, name: str) -> Iterator[bytes]:
        """Offsets ``0, l0, l0+l1, ...`` from the spooled int64 lengths."""
        total = np.int64(0)
        yield np.int64(0).tobytes()
        for piece in self._copy(name):
            sums = np.cumsum(np.frombuffer(piece, dtype="<i8")) + total
            if len(sums):
                total = sums[-1]
            yield sums.astype("<i8").tobytes()


def _spool() -> tempfile.SpooledTemporaryFile[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=4 << 20, prefix="shardstream-table-")
