"""The dataset index, ``index.json``: what `pack` wrote, read back and validated.

Schema (version 1); all sizes and offsets are bytes, offsets count from the start of the
shard file. ``totals`` follows ``shards`` so that the index can be written shard by shard::

    {
      "format": "shardstream-index",
      "version": 1,
      "shards": [
        {"name": "data-000000.tar",          # relative to the directory holding index.json
         "bytes": int,                       # size of the shard file
         "num_samples": int,
         "crc32": "<8 hex digits>",          # CRC-32 (zlib, gzip, S3) of the whole shard file
         "samples": [
           {"key": "cat/000001",
            "members": [{"name": "cat/000001.cls", "offset": int, "size": int}, ...]}
         ]}
      ],
      "totals": {"num_shards": int, "num_samples": int, "num_members": int, "bytes": int}
    }

``offset`` is where the member's payload starts (its tar header ends there), ``size`` the
payload length, so ``shard[offset:offset + size]`` is the original file.
"""

from __future__ import annotations

import gc
import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import IndexFormatError

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "INDEX_VERSION",
    "Index",
    "MemberEntry",
    "SampleEntry",
    "ShardEntry",
    "ShardJson",
    "sample_json",
    "shard_json_head",
    "write_index",
]

INDEX_FORMAT = "shardstream-index"
INDEX_VERSION = 1
INDEX_NAME = "index.json"


@dataclass(frozen=True, slots=True)
class MemberEntry:
    """One file inside a shard: payload ``size`` bytes at byte ``offset``."""

    name: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class SampleEntry:
    """One sample: its key and its members, adjacent in the shard."""

    key: str
    members: tuple[MemberEntry, ...]


class ShardEntry:
    """One shard file: name relative to the index, size in bytes, CRC-32 of its bytes (hex),
    its sample count, and its samples' keys and member offsets.

    ``samples`` is built on first use from the index's JSON (and validated then, raising
    :class:`IndexFormatError`): a reader that only needs names, sizes and counts of many
    shards does not pay for every sample's entry up front.
    """

    __slots__ = ("_raw", "_samples", "_url", "bytes", "crc32", "name", "num_samples")

    def __init__(
        self,
        name: str,
        bytes: int,
        crc32: str,
        samples: tuple[SampleEntry, ...] | None = None,
        *,
        num_samples: int | None = None,
        raw_samples: list[Any] | None = None,
        url: str = "index.json",
    ) -> None:
        self.name, self.bytes, self.crc32 = name, bytes, crc32
        if samples is not None:
            self._samples: tuple[SampleEntry, ...] | None = tuple(samples)
            self.num_samples = len(self._samples)
        else:
            if raw_samples is None or num_samples is None:
                raise TypeError("ShardEntry needs samples, or raw_samples and num_samples")
            self._samples = None
            self.num_samples = num_samples
        self._raw = raw_samples
        self._url = url

    @property
    def samples(self) -> tuple[SampleEntry, ...]:
        if self._samples is None:
            raw = self._raw_samples()
            try:
                self._samples = tuple(_sample(x) for x in raw)
            except (KeyError, TypeError, ValueError) as exc:
                raise IndexFormatError(
                    f"{self._url}: malformed sample entry in shard {self.name} ({exc!r}); re-run shardstream pack"
                ) from exc
            self._raw = None
        return self._samples

    def sample_ends_and_keys(self) -> tuple[list[int], list[str]]:
        """Per sample: the byte where it ends (its last payload's padding included; the next
        sample's headers start there) and its key. Read from the index's JSON without
        building :attr:`samples`.

        Raises:
            IndexFormatError: a sample entry is malformed.
        """
        if self._samples is not None:
            return [_end(x.members[-1].offset, x.members[-1].size) for x in self._samples], [
                x.key for x in self._samples
            ]
        raw = self._raw_samples()
        try:
            ends = [_end(_typed(x["members"][-1]["offset"], int), _typed(x["members"][-1]["size"], int)) for x in raw]
            keys = [_typed(x["key"], str) for x in raw]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise IndexFormatError(
                f"{self._url}: malformed sample entry in shard {self.name} ({exc!r}); re-run shardstream pack"
            ) from exc
        return ends, keys

    @property
    def num_members(self) -> int:
        if self._samples is None:
            return sum(len(x["members"]) for x in self._raw_samples())
        return sum(len(x.members) for x in self._samples)

    def _raw_samples(self) -> list[Any]:
        """The index's JSON entries of the samples, kept until :attr:`samples` is built from them."""
        assert self._raw is not None  # internal invariant: the constructor keeps them whenever _samples is None
        return self._raw

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardEntry):
            return NotImplemented
        return (self.name, self.bytes, self.crc32, self.num_samples, self.samples) == (
            other.name,
            other.bytes,
            other.crc32,
            other.num_samples,
            other.samples,
        )

    def __hash__(self) -> int:
        return hash((self.name, self.bytes, self.crc32, self.num_samples))

    def __repr__(self) -> str:
        return (
            f"ShardEntry(name={self.name!r}, bytes={self.bytes}, crc32={self.crc32!r}, num_samples={self.num_samples})"
        )


@dataclass(frozen=True, slots=True)
class Index:
    """A whole dataset: its shards in order."""

    shards: tuple[ShardEntry, ...]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.shards)

    @property
    def num_members(self) -> int:
        return sum(s.num_members for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> bytes:
        """The index as UTF-8 JSON bytes (deterministic: no timestamps, fixed key order)."""
        out = io.BytesIO()
        write_index(
            out.write,
            (
                ShardJson(
                    shard_json_head(name=s.name, bytes_=s.bytes, num_samples=s.num_samples, crc32=s.crc32)
                    + b",".join(sample_json(x.key, ((m.name, m.offset, m.size) for m in x.members)) for x in s.samples)
                    + b"]}",
                    s.num_samples,
                    sum(len(x.members) for x in s.samples),
                    s.bytes,
                )
                for s in self.shards
            ),
        )
        return out.getvalue()

    @classmethod
    def from_json(cls, data: bytes, *, url: str) -> Index:
        """Parse and validate index bytes.

        Args:
            data: the content of an ``index.json``.
            url: where it came from, named in errors.

        Raises:
            IndexFormatError: not JSON, another format or version, a missing or mistyped
                field, or totals that disagree with the shards.
        """
        # The parse makes ~10 objects per sample; with torch imported, each of the cyclic
        # collector's passes it would trigger walks millions of objects (70 ms instead of 10
        # for 5,000 samples). Nothing here makes cycles, so collection waits until the end.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            doc = json.loads(data.decode("utf-8", "surrogateescape"))
        except ValueError as exc:
            raise IndexFormatError(f"{url}: not valid JSON ({exc}); re-run shardstream pack") from exc
        finally:
            if was_enabled:
                gc.enable()
        if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
            raise IndexFormatError(f'{url}: not a shardstream index (no "format": "{INDEX_FORMAT}")')
        if doc.get("version") != INDEX_VERSION:
            raise IndexFormatError(
                f"{url}: index version {doc.get('version')!r} is not supported by this "
                f"shardstream (reads version {INDEX_VERSION}); upgrade shardstream or re-pack"
            )
        try:
            shards = tuple(_shard(s, url=url) for s in doc["shards"])
            totals = doc["totals"]
            index = cls(shards=shards)
            expected = {
                "num_shards": index.num_shards,
                "num_samples": index.num_samples,
                "num_members": index.num_members,
                "bytes": index.total_bytes,
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexFormatError(f"{url}: malformed index ({exc!r}); re-run shardstream pack") from exc
        if totals != expected:
            raise IndexFormatError(f"{url}: totals {totals} disagree with the shards ({expected})")
        return index


def sample_json(key: str, members: Iterable[tuple[str, int, int]]) -> bytes:
    """One sample's index entry as JSON bytes; members are ``(name, offset, size)``.

    Formatted by hand (strings through json's own encoder) as ``json.dumps`` would with
    ``separators=(",", ":"), ensure_ascii=False``, at a third of its cost: pack calls it
    once per sample.
    """
    quote = json.encoder.encode_basestring
    entries = ",".join(f'{{"name":{quote(n)},"offset":{o},"size":{z}}}' for n, o, z in members)
    return f'{{"key":{quote(key)},"members":[{entries}]}}'.encode()


def shard_json_head(*, name: str, bytes_: int, num_samples: int, crc32: str) -> bytes:
    """A shard entry's JSON up to the opening ``[`` of its samples (the same key order as
    :meth:`Index.to_json`); the samples and ``"]}"`` follow."""
    head = _dumps({"name": name, "bytes": bytes_, "num_samples": num_samples, "crc32": crc32, "samples": []})
    return head[: -len(b"]}")]


@dataclass(frozen=True)
class ShardJson:
    """A shard entry as the JSON text of the index, with the counts the totals need."""

    text: bytes
    num_samples: int
    num_members: int
    bytes: int


def write_index(write: Callable[[bytes], Any], shards: Iterable[ShardJson]) -> dict[str, int]:
    """Write an index shard by shard, holding one shard's entry in memory at a time.

    Args:
        write: receives the UTF-8 JSON bytes in pieces.
        shards: the shards' entries in dataset order.

    Returns:
        The totals written.
    """
    totals = {"num_shards": 0, "num_samples": 0, "num_members": 0, "bytes": 0}
    write(f'{{"format":"{INDEX_FORMAT}","version":{INDEX_VERSION},"shards":['.encode())
    for shard in shards:
        write((b"," if totals["num_shards"] else b"") + shard.text)
        totals["num_shards"] += 1
        totals["num_samples"] += shard.num_samples
        totals["num_members"] += shard.num_members
        totals["bytes"] += shard.bytes
    write(b'],"totals":' + _dumps(totals) + b"}")
    return totals


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _shard(s: dict[str, Any], *, url: str) -> ShardEntry:
    raw = s["samples"]
    if not isinstance(raw, list):
        raise TypeError(f"expected a list of samples, got {raw!r}")
    entry = ShardEntry(
        name=_typed(s["name"], str),
        bytes=_typed(s["bytes"], int),
        crc32=_typed(s["crc32"], str),
        num_samples=_typed(s["num_samples"], int),
        raw_samples=raw,
        url=url,
    )
    if entry.num_samples != len(raw):
        raise ValueError(f"shard {entry.name}: num_samples disagrees with its samples")
    if "/" in entry.name or entry.name in ("", ".", ".."):
        raise ValueError(f"shard name {entry.name!r} must be a plain file name")
    return entry


def _sample(x: dict[str, Any]) -> SampleEntry:
    return SampleEntry(
        key=_typed(x["key"], str),
        members=tuple(
            MemberEntry(_typed(m["name"], str), _typed(m["offset"], int), _typed(m["size"], int)) for m in x["members"]
        ),
    )


def _end(offset: int, size: int) -> int:
    return offset + -(-size // 512) * 512


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value
