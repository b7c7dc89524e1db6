"""The version 2 manifest, ``index.bin``: one row per shard, as numeric columns.

What a rank must read to open a dataset is O(shards): per shard its name, size, sample and
member counts and CRC-32, plus totals. Per-sample data lives in one table per shard
(:mod:`shardstream.index.table`), read only where needed. Container: :mod:`.container`.

Header fields: ``format`` ("shardstream-index"), ``version`` (2), ``num_shards``,
``num_samples``, ``num_members``, ``bytes`` (totals), ``table_suffix`` (".samples": shard
``NAME``'s table is ``NAME.samples`` beside it), and ``foreign`` (true, only in an index
``shardstream index build`` wrote for other tools' shards: readers parsing a whole shard
skip its links, as when reading it without an index), ``shards_url`` (only when the
shards lie elsewhere than the index and its tables: ``index build --output``; their
directory or S3 prefix), ``partial`` (only in an index that ``shardstream index build
--partial`` wrote over an unfinished pack's shards: one line saying what is missing, which
readers print as a warning), and ``classes`` and ``class_counts`` (only in a labelled dataset:
``pack --labels-from-dirs``, or a reshard or ``index build`` of one): the class names in
class-index order (a sample's ``cls`` member holds its class's position) and the samples of
each (null when not known). Columns, one entry per shard in dataset order:

==============  =======  =========================================================
``bytes``       int64    size of the shard file
``num_samples`` int64    samples in it
``num_members`` int64    members (files) in it
``crc32``       uint32   CRC-32 (zlib, gzip, S3) of the whole shard file
``name_offsets`` int64   ``num_shards + 1`` offsets into ``names``
``names``       uint8    the shard names, UTF-8, concatenated (relative to the manifest)
==============  =======  =========================================================

A million shards make about 40 MB; opening maps the file (or the bytes of one GET) and takes
views of it: no Python object per shard, and DataLoader workers share the pages.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from . import container

__all__ = ["MANIFEST_NAME", "TABLE_SUFFIX", "Manifest"]

MANIFEST_NAME = "index.bin"
TABLE_SUFFIX = ".samples"
FORMAT = "shardstream-index"
VERSION = 2
MAGIC = b"SSINDEX\x00"


class Manifest:
    """A dataset's shards as columns (module doc). Build with :meth:`parse`, :meth:`open_file`
    or :meth:`from_columns`; write with :meth:`pieces`.

    Attributes:
        url: where it was read from (named in errors).
        shard_bytes, shard_samples, shard_members: int64 arrays of shape ``(num_shards,)``.
        crc32: uint32 array of shape ``(num_shards,)``.
        foreign: indexes shards other tools wrote (``shardstream index build``).
        shards_url: where the shards lie when not beside the index, else None.
        classes: the class names of a labelled dataset, in class-index order, else None.
        class_counts: the samples of each class (same order), else None.
        partial: None, or, for an index of an unfinished pack's shards (``index build
            --partial``), the line that says what is missing and how to finish it.
    """

    def __init__(
        self,
        *,
        url: str,
        shard_bytes: np.ndarray,
        shard_samples: np.ndarray,
        shard_members: np.ndarray,
        crc32: np.ndarray,
        name_offsets: np.ndarray,
        names: np.ndarray,
        source: tuple[str, Any] | None = None,
        foreign: bool = False,
        shards_url: str | None = None,
        classes: Sequence[str] | None = None,
        class_counts: Sequence[int] | None = None,
        partial: str | None = None,
    ) -> None:
        self.url = url
        self.foreign = foreign
        self.partial = partial
        self.shards_url = shards_url
        self.classes = None if classes is None else list(classes)
        self.class_counts = None if class_counts is None else [int(c) for c in class_counts]
        self.shard_bytes, self.shard_samples, self.shard_members = shard_bytes, shard_samples, shard_members
        self.crc32 = crc32
        self._name_offsets, self._names = name_offsets, names
        self._source = source  # ("file", path) or ("shm", SharedFile): re-mapped when unpickled
        self._key_columns: dict[str, np.ndarray] | None = None  # first/last key per shard, when sorted
        self._key_ranges: tuple[list[str], list[str]] | None = None  # the same, decoded (key_ranges)

    def __repr__(self) -> str:
        return f"Manifest({self.url!r}, num_shards={self.num_shards}, num_samples={self.num_samples})"

    @property
    def num_shards(self) -> int:
        return len(self.shard_bytes)

    @property
    def num_samples(self) -> int:
        return int(self.shard_samples.sum())

    @property
    def num_members(self) -> int:
        return int(self.shard_members.sum())

    @property
    def total_bytes(self) -> int:
        return int(self.shard_bytes.sum())

    def totals(self) -> dict[str, int]:
        return {
            "num_shards": self.num_shards,
            "num_samples": self.num_samples,
            "num_members": self.num_members,
            "bytes": self.total_bytes,
        }

    def name(self, i: int) -> str:
        """Shard ``i``'s file name, relative to the manifest.

        Raises:
            IndexFormatError: the name is not UTF-8.
        """
        raw = self._names[self._name_offsets[i] : self._name_offsets[i + 1]].tobytes()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IndexFormatError(f"{self.url}: shard {i}'s name is not UTF-8 ({exc})") from exc

    def names(self) -> Iterator[str]:
        return (self.name(i) for i in range(self.num_shards))

    def table_name(self, i: int) -> str:
        """The file name of shard ``i``'s sample table, beside the shard."""
        return self.name(i) + TABLE_SUFFIX

    def crc32_hex(self, i: int) -> str:
        return f"{int(self.crc32[i]):08x}"

    def content_digest(self) -> str:
        """A SHA-1 (hex) of what the index says the dataset holds: each shard's name, size,
        sample and member counts and CRC-32, and the classes with their counts. Header notes
        and key ranges (``index keys`` adds them to ``index.bin``) are left out, so an index
        rebuilt over the same shards has the same digest; ``pack`` records it when it writes
        the index, to tell its own index from one written over its shards by another command."""
        digest = hashlib.sha1()
        for column in (self.shard_bytes, self.shard_samples, self.shard_members, self._name_offsets):
            digest.update(np.ascontiguousarray(column, dtype="<i8").tobytes())
        digest.update(np.ascontiguousarray(self.crc32, dtype="<u4").tobytes())
        digest.update(np.ascontiguousarray(self._names, dtype="|u1").tobytes())
        digest.update(json.dumps([self.classes, self.class_counts]).encode())
        return digest.hexdigest()

    # serialisation

    def pieces(self) -> Iterator[bytes]:
        """The manifest file's bytes, in pieces."""
        fields: dict[str, Any] = {"format": FORMAT, "version": VERSION, "table_suffix": TABLE_SUFFIX, **self.totals()}
        if self.foreign:
            fields["foreign"] = True
        if self.shards_url:
            fields["shards_url"] = self.shards_url
        if self.partial:
            fields["partial"] = self.partial
        if self.classes is not None:
            fields["classes"] = self.classes
            fields["class_counts"] = self.class_counts
        columns = [
            ("bytes", self.shard_bytes.astype("<i8")),
            ("num_samples", self.shard_samples.astype("<i8")),
            ("num_members", self.shard_members.astype("<i8")),
            ("crc32", self.crc32.astype("<u4")),
            ("name_offsets", self._name_offsets.astype("<i8")),
            ("names", self._names.astype("|u1")),
        ]
        if self._key_columns is not None:
            fields["keys_sorted"] = True
            columns += [(name, self._key_columns[name]) for name in _KEY_COLUMNS]
        return container.to_pieces(MAGIC, fields, columns)

    def key_ranges(self) -> tuple[list[str], list[str]] | None:
        """Each shard's first and last sample key, ``(first, last)``, two lists of
        ``num_shards`` strings, or None.

        They are recorded (header field ``keys_sorted``, columns ``first_key_offsets``,
        ``first_keys``, ``last_key_offsets``, ``last_keys``) only where the writer checked, over
        every table, that (1) each shard's keys strictly increase (in code-point order, which is
        UTF-8 byte order) and (2) each shard's first key is greater than the previous shard's
        last key, with no empty shard. Then ``first`` and ``last`` are both sorted, and a key
        ``k`` can only be in shard ``s = bisect_right(first, k) - 1``, if ``s >= 0`` and
        ``k <= last[s]``, at the row a binary search of that shard's keys finds. ``pack``
        without ``--shuffle`` writes keys sorted within a stream; a pack of one stream
        (``--workers 1``, one part) meets both conditions, a pack of several streams
        interleaves their shards, so its ranges overlap and this is None: use the key index
        (:class:`~shardstream.index.keys.KeyIndex`). Written by ``pack``, ``ShardWriter``,
        ``pack_samples``, the Ray writers, ``index build`` and ``index keys``.

        Raises:
            IndexFormatError: a recorded key is not UTF-8.
        """
        if self._key_columns is None:
            return None
        if self._key_ranges is not None:
            return self._key_ranges
        c = self._key_columns
        try:
            first = _texts(c["first_keys"], c["first_key_offsets"])
            last = _texts(c["last_keys"], c["last_key_offsets"])
        except UnicodeDecodeError as exc:
            raise IndexFormatError(f"{self.url}: a recorded first or last key is not UTF-8 ({exc})") from exc
        self._key_ranges = first, last  # decoded once: a reader bisects them for every key
        return self._key_ranges

    def set_key_ranges(self, ranges: tuple[Sequence[str], Sequence[str]] | None) -> None:
        """Record each shard's first and last key (checked sorted as :meth:`key_ranges`
        says), or drop them (None); written by :meth:`pieces`.

        Raises:
            ValueError: not one key of each per shard, or not sorted.
        """
        self._key_ranges = None
        if ranges is None:
            self._key_columns = None
            return
        first, last = list(ranges[0]), list(ranges[1])
        if len(first) != self.num_shards or len(last) != self.num_shards:
            raise ValueError(f"{self.url}: {len(first)} first and {len(last)} last keys for {self.num_shards} shards")
        for i in range(self.num_shards):
            if first[i] > last[i] or (i and first[i] <= last[i - 1]):
                raise ValueError(f"{self.url}: key ranges not sorted at shard {i} ({self.name(i)})")
        columns: dict[str, np.ndarray] = {}
        for which, keys in (("first", first), ("last", last)):
            encoded = [k.encode("utf-8") for k in keys]
            offsets = np.zeros(len(encoded) + 1, dtype="<i8")
            np.cumsum([len(e) for e in encoded], out=offsets[1:])
            columns[f"{which}_key_offsets"] = offsets
            columns[f"{which}_keys"] = np.frombuffer(b"".join(encoded), dtype="|u1")
        self._key_columns = columns

    @classmethod
    def from_columns(
        cls,
        *,
        names: Iterable[str],
        shard_bytes: Sequence[int] | np.ndarray,
        shard_samples: Sequence[int] | np.ndarray,
        shard_members: Sequence[int] | np.ndarray,
        crc32: Sequence[int] | np.ndarray,
        url: str = MANIFEST_NAME,
        foreign: bool = False,
        shards_url: str | None = None,
        classes: Sequence[str] | None = None,
        class_counts: Sequence[int] | None = None,
        partial: str | None = None,
    ) -> Manifest:
        """A manifest from per-shard values (names and classes are checked as :meth:`parse` does)."""
        encoded = [name.encode("utf-8") for name in names]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        manifest = cls(
            url=url,
            shard_bytes=np.asarray(shard_bytes, dtype=np.int64),
            shard_samples=np.asarray(shard_samples, dtype=np.int64),
            shard_members=np.asarray(shard_members, dtype=np.int64),
            crc32=np.asarray(crc32, dtype=np.uint32),
            name_offsets=offsets,
            names=blob,
            foreign=foreign,
            shards_url=shards_url,
            classes=classes,
            class_counts=class_counts,
            partial=partial,
        )
        manifest._check()
        return manifest

    @classmethod
    def parse(cls, buffer: Any, *, url: str, source: tuple[str, Any] | None = None) -> Manifest:
        """A manifest from the bytes of ``index.bin`` (views, no copy), validated.

        Raises:
            IndexFormatError: not a manifest, another version, columns of the wrong type or
                length, totals that disagree with the columns, or a bad shard name.
        """
        fields, columns = container.read(buffer, magic=MAGIC, url=url, kind="index")
        if fields.get("format") != FORMAT or fields.get("version") != VERSION:
            raise IndexFormatError(
                f"{url}: index version {fields.get('version')!r} is not supported by this shardstream "
                f"(reads version {VERSION}); upgrade shardstream or re-pack"
            )
        expected = {
            "bytes": "<i8",
            "num_samples": "<i8",
            "num_members": "<i8",
            "crc32": "<u4",
            "name_offsets": "<i8",
            "names": "|u1",
        }
        for name, dtype in expected.items():
            if name not in columns or columns[name].dtype.str != dtype:
                raise IndexFormatError(f"{url}: column {name!r} missing or not {dtype}; re-run shardstream pack")
        manifest = cls(
            url=url,
            shard_bytes=columns["bytes"],
            shard_samples=columns["num_samples"],
            shard_members=columns["num_members"],
            crc32=columns["crc32"],
            name_offsets=columns["name_offsets"],
            names=columns["names"],
            source=source,
            foreign=fields.get("foreign") is True,
            shards_url=str(fields["shards_url"]) if fields.get("shards_url") else None,
            partial=str(fields["partial"]) if fields.get("partial") else None,
            **_classes_of(fields, url),
        )
        manifest._check()
        if fields.get("keys_sorted") is True:
            manifest._key_columns = _key_columns_of(columns, manifest.num_shards, url)
        totals = {k: fields.get(k) for k in ("num_shards", "num_samples", "num_members", "bytes")}
        if totals != manifest.totals():
            raise IndexFormatError(f"{url}: totals {totals} disagree with the shards ({manifest.totals()})")
        return manifest

    @classmethod
    def open_file(cls, path: str | os.PathLike[str], *, url: str | None = None) -> Manifest:
        """A local ``index.bin``, memory-mapped (DataLoader workers share its pages).

        Raises:
            FileNotFoundError: no such file; IndexFormatError: as :meth:`parse`.
        """
        path = os.fspath(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buffer: Any = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
        return cls.parse(buffer, url=url or path, source=("file", path))

    def _check(self) -> None:
        if self.classes is None and self.class_counts is not None:
            raise IndexFormatError(f"{self.url}: class_counts without classes; re-run shardstream pack")
        if self.classes is not None and (
            not all(isinstance(c, str) for c in self.classes)
            or (self.class_counts is not None and len(self.class_counts) != len(self.classes))
            or any(c < 0 for c in self.class_counts or ())
        ):
            raise IndexFormatError(
                f"{self.url}: {len(self.classes)} classes with class_counts {self.class_counts}: they disagree; "
                "re-run shardstream pack"
            )
        n = len(self.shard_bytes)
        if not (
            len(self.shard_samples) == len(self.shard_members) == len(self.crc32) == n
            and len(self._name_offsets) == n + 1
        ):
            raise IndexFormatError(f"{self.url}: columns of different lengths; re-run shardstream pack")
        lengths = np.diff(self._name_offsets)
        if (self._name_offsets[:1] != 0).any() or self._name_offsets[-1] != len(self._names) or (lengths < 1).any():
            raise IndexFormatError(f"{self.url}: bad shard name offsets; re-run shardstream pack")
        if (
            (self.shard_bytes < 0).any()
            or (self.shard_samples < 0).any()
            or (self.shard_members < self.shard_samples).any()
        ):
            raise IndexFormatError(f"{self.url}: negative sizes or counts; re-run shardstream pack")
        if (self._names == ord("/")).any() or (self._names == 0).any():
            raise IndexFormatError(f"{self.url}: a shard name holds '/' or NUL; shard names are plain file names")
        for i in np.flatnonzero(lengths <= 2).tolist():
            if self.name(i) in (".", ".."):
                raise IndexFormatError(f"{self.url}: shard name {self.name(i)!r} must be a plain file name")

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """``{class name: class index}`` of a labelled dataset (torchvision's ``class_to_idx``), else None."""
        return None if self.classes is None else {name: i for i, name in enumerate(self.classes)}

    # pickling: re-map the file in the receiving process instead of copying the columns

    def __getstate__(self) -> dict[str, Any]:
        if self._source is None:
            return self.__dict__.copy()
        return {"url": self.url, "_source": self._source}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shard_bytes" in state:
            self.__dict__.update(state)
            return
        kind, where = state["_source"]
        if kind == "file":
            fresh = Manifest.open_file(where, url=state["url"])
        else:
            buffer = where.buffer()
            if buffer is None:
                raise IndexFormatError(f"{state['url']}: the shared copy of the index is gone (its process exited)")
            fresh = Manifest.parse(buffer, url=state["url"], source=state["_source"])
        self.__dict__.update(fresh.__dict__)


_KEY_COLUMNS = ("first_key_offsets", "first_keys", "last_key_offsets", "last_keys")


def _key_columns_of(columns: dict[str, np.ndarray], num_shards: int, url: str) -> dict[str, np.ndarray]:
    """The optional first/last key columns, checked.

    Raises:
        IndexFormatError: missing, of the wrong type or length, or bad offsets.
    """
    out = {}
    for name in _KEY_COLUMNS:
        dtype = "<i8" if name.endswith("offsets") else "|u1"
        column = columns.get(name)
        if column is None or column.dtype.str != dtype:
            raise IndexFormatError(
                f"{url}: keys_sorted without column {name!r} of {dtype}; re-run shardstream index keys"
            )
        out[name] = column
    for which in ("first", "last"):
        offsets, blob = out[f"{which}_key_offsets"], out[f"{which}_keys"]
        if (
            len(offsets) != num_shards + 1
            or (offsets[:1] != 0).any()
            or offsets[-1] != len(blob)
            or (np.diff(offsets) < 0).any()
        ):
            raise IndexFormatError(f"{url}: bad {which}_key_offsets; re-run shardstream index keys")
    return out


def _texts(blob: np.ndarray, offsets: np.ndarray) -> list[str]:
    text = blob.tobytes()
    bounds = offsets.tolist()
    return [text[a:b].decode("utf-8") for a, b in itertools.pairwise(bounds)]


def _classes_of(fields: dict[str, Any], url: str) -> dict[str, Any]:
    """The ``classes`` and ``class_counts`` header fields (absent in older indexes: None).

    Raises:
        IndexFormatError: they are not a list of names and a list of integers.
    """
    classes, counts = fields.get("classes"), fields.get("class_counts")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise IndexFormatError(f"{url}: 'classes' is not a list of names; re-run shardstream pack")
    if counts is not None and not (
        isinstance(counts, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in counts)
    ):
        raise IndexFormatError(f"{url}: 'class_counts' is not a list of integers; re-run shardstream pack")
    return {"classes": classes, "class_counts": counts}
