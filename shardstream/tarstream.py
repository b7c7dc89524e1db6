"""A streaming tar reader: members and samples from any object with ``read(n)``, or from a
:class:`ShardStream` (the streams :mod:`shardstream.storage` gives, whose chunks it takes
uncopied).

It parses 512-byte headers itself (ustar, GNU long names, PAX names and sizes), checks each
header's checksum, skips directories, refuses links, devices, FIFOs, absolute paths and
``..`` (CorruptShardError: nothing is ever extracted, but a shard holding them was not made
by pack), and hands each payload on as one ``bytes`` object read once from the stream.
"""

from __future__ import annotations

import logging
import mmap
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeGuard

from .compression import decompressed
from .errors import CorruptShardError
from .format import BLOCK_BYTES, RESERVED_FIELDS

log = logging.getLogger("shardstream")

__all__ = [
    "Batch",
    "Chunk",
    "Hashed",
    "Pieces",
    "ReadStream",
    "ShardStream",
    "Window",
    "iter_members",
    "iter_members_at",
    "iter_sample_batches",
    "iter_samples",
    "read_header",
    "stream_chunks",
]

_FILE_TYPES = frozenset({b"0", b"\0", b"7"})
_REFUSED_TYPES = {
    b"1": "hard link",
    b"2": "symbolic link",
    b"3": "character device",
    b"4": "block device",
    b"6": "FIFO",
}


class Batch(list[dict[str, Any] | None]):
    """Consecutive samples of one reader (dicts, or None for one lost to ``on_error="skip"``),
    with ``nbytes``: their payload bytes, counted once for the batch."""

    __slots__ = ("nbytes",)

    def __init__(self, samples: Iterable[dict[str, Any] | None] = (), nbytes: int = 0) -> None:
        super().__init__(samples)
        self.nbytes = nbytes


class Pieces:
    """Consecutive pieces of a shard's bytes handed on together: one ranged GET's body as the
    HTTP client received it (pieces of up to 2 MiB, uncopied), so a slicer works out all
    their samples at once instead of a piece at a time. ``len`` is their bytes."""

    __slots__ = ("nbytes", "pieces")

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces
        self.nbytes = sum(map(len, pieces))

    def __len__(self) -> int:
        return self.nbytes


class Window:
    """Bytes ``start`` to ``end`` of a memory map (a byte range of a mapped shard), handed on
    as a chunk: ``len`` and slices to ``bytes`` like one, and :meth:`window` for a reader that
    slices the map itself."""

    __slots__ = ("_len", "_map", "_start")

    def __init__(self, mapped: mmap.mmap, start: int, end: int) -> None:
        self._map, self._start, self._len = mapped, start, end - start

    def __len__(self) -> int:
        return self._len

    def window(self) -> tuple[mmap.mmap, int, int]:
        """``(map, start, end)``: the map and where this window lies in it."""
        return self._map, self._start, self._start + self._len

    def __getitem__(self, key: slice) -> bytes:
        a, b, _ = key.indices(self._len)
        return self._map[self._start + a : self._start + max(a, b)]


#: A piece of a shard's bytes as a :class:`ShardStream` hands it on: ``bytes``, a memory map
#: of a whole shard, or a :class:`Window` of one.
Chunk = bytes | mmap.mmap | Window


class ReadStream(Protocol):
    """Anything with ``read(n) -> bytes`` that returns fewer than ``n`` bytes only at the end."""

    def read(self, n: int, /) -> bytes: ...


class ShardStream(Protocol):
    """A shard's bytes (or a byte range of them), front to back: what
    :func:`~shardstream.storage.fetch.iter_shard_streams` yields, the one interface the tar
    parser, the slicer and the reading engine use. A stream implements it explicitly (its
    class subclasses this one), as the streams of :mod:`shardstream.storage` and
    :class:`Hashed` do: the tar parser tells one from a plain :class:`ReadStream` by its
    class.

    Read it one way only: :meth:`read`, :meth:`chunks` or :meth:`groups`.
    """

    #: The local file the stream reads in place, which stays readable after the stream has
    #: moved on (a local shard's); None for any other (remote shards, cache entries, which
    #: may be evicted, files that are not mapped).
    path: str | None

    def read(self, n: int, /) -> bytes:
        """Up to ``n`` bytes; fewer only at the end."""
        ...

    def chunks(self) -> Iterator[Chunk]:
        """The rest of the stream in :data:`Chunk` s of any size, uncopied. A chunk handed
        out may be released when the next one is asked for."""
        ...

    def groups(self) -> Iterator[Chunk | Pieces]:
        """As :meth:`chunks`, but where the stream received several pieces together (one
        ranged GET's body) they come as one :class:`Pieces`, for a slicer to work out all
        their samples at once."""
        ...


def _number(field: bytes, *, url: str, offset: int) -> int:
    if field[-1] in (0, 32) and field[0] != 0:  # the usual layout: octal digits, then NUL or space
        try:
            return int(field[:-1], 8)
        except ValueError:
            pass
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        return -value if field[:1] == b"\xff" else value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise CorruptShardError(
            f"{url}: bad numeric field {field!r} in tar header at byte {offset}; "
            "the shard is corrupt, re-pack or re-upload it"
        ) from None


def _pax_records(data: bytes, *, url: str, offset: int) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise CorruptShardError(f"{url}: bad PAX header at byte {offset}") from None
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def iter_members(
    stream: ReadStream | ShardStream, *, url: str, end_of_archive: bool = True
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member_name, payload)`` for each regular file in a tar stream, in order.

    Raises:
        CorruptShardError: as :func:`iter_members_at`.
    """
    for name, _, payload in iter_members_at(stream, url=url, end_of_archive=end_of_archive):
        yield name, payload


def iter_members_at(
    stream: ReadStream | ShardStream,
    *,
    url: str,
    base_offset: int = 0,
    end_of_archive: bool = True,
    foreign: bool = False,
    payloads: bool = True,
) -> Iterator[tuple[str, int, Any]]:
    """Yield ``(member_name, payload_offset, payload)`` for each regular file, in order;
    ``payload_offset`` is the byte where the payload starts in the tar stream.

    Args:
        stream: the shard's bytes, read front to back: an object with ``read(n)``, or a
            :class:`ShardStream`, whose chunks are taken as they are (it saves a method call
            per header and payload).
        url: the shard's URL, named in errors.
        base_offset: where the stream starts in the shard (a byte range of it starts at a
            member's header); offsets yielded and named in errors count from the shard's start.
        end_of_archive: the stream must end with the end-of-archive blocks; False for a byte
            range, which may also end cleanly after a member.
        foreign: a shard without a shardstream index (another tool's, read as WebDataset
            reads it): links, devices and FIFOs are skipped, never followed, and a stream
            that ends at a member boundary without the end-of-archive blocks is read; each
            logs one warning for the shard.
        payloads: False: yield each payload's size (an int) instead of its bytes, which are
            passed over uncopied (indexing needs offsets and sizes only).

    Raises:
        CorruptShardError: a header fails its checksum, a field is malformed, the stream
            ends before the end-of-archive blocks (or, for a range, inside a member), or
            (unless ``foreign``) a member is a link, device or FIFO.
    """
    chunks = stream_chunks(stream)
    if foreign:
        chunks = decompressed(iter(chunks), url)
    return _members(iter(chunks), url, base_offset, end_of_archive, foreign, payloads)


_SPARSE_KEYS = frozenset({"GNU.sparse.major", "GNU.sparse.map", "GNU.sparse.size", "GNU.sparse.numblocks"})


class Hashed(ShardStream):
    """A shard stream whose bytes are counted and CRC-32'd (zlib, no copy) as a reader takes
    them; :meth:`drain` takes the rest, so ``crc32`` and ``nbytes`` cover the whole stream.
    ``head``: its first bytes (up to 4), to tell a compressed shard. Its :attr:`path` is None:
    its bytes are to be read through it."""

    path: str | None = None

    def __init__(self, stream: ReadStream | ShardStream) -> None:
        self._source = stream
        self._chunks: Iterator[Any] | None = None
        self.crc32 = 0
        self.nbytes = 0
        self.head = b""

    def read(self, n: int, /) -> bytes:
        out = self._source.read(n)
        self._count(out)
        return out

    def chunks(self) -> Iterator[Chunk]:
        self._chunks = stream_chunks(self._source)
        return self._counted()

    def groups(self) -> Iterator[Chunk | Pieces]:
        """Like :meth:`chunks`, with the source's :class:`Pieces` where it has them."""
        self._chunks = stream_chunks(self._source, grouped=True)
        return self._counted()

    def drain(self) -> None:
        for _ in self.chunks() if self._chunks is None else self._counted():
            pass

    def _counted(self) -> Iterator[Any]:
        assert self._chunks is not None  # internal invariant: chunks() set it
        for chunk in self._chunks:
            for piece in chunk.pieces if type(chunk) is Pieces else (chunk,):
                self._count(piece)
            yield chunk

    def _count(self, piece: Any) -> None:
        if len(self.head) < 4:
            self.head += bytes(piece[: 4 - len(self.head)])
        self.crc32 = zlib.crc32(piece, self.crc32)
        self.nbytes += len(piece)


def stream_chunks(
    stream: ReadStream | ShardStream, chunk_bytes: int = 1 << 20, *, grouped: bool = False
) -> Iterator[Any]:
    """A shard stream's bytes in pieces: a :class:`ShardStream`'s own chunks (uncopied; with
    ``grouped``, its groups, which may hand on :class:`Pieces`), else ``read(chunk_bytes)``
    until it ends."""
    if _declares(stream):
        return iter(stream.groups() if grouped else stream.chunks())
    return iter(lambda: stream.read(chunk_bytes), b"")


def _declares(stream: ReadStream | ShardStream) -> TypeGuard[ShardStream]:
    """Whether ``stream``'s class implements :class:`ShardStream` explicitly (a class check,
    0.1 us, where a structural ``isinstance`` costs some 30 us a shard)."""
    return ShardStream in type(stream).__mro__


def _take(chunks: Iterator[bytes], buf: bytes, pos: int, n: int) -> tuple[bytes, bytes, int]:
    """``n`` bytes from ``buf[pos:]`` and then the next chunks (fewer only at the end), and the
    new ``(buf, pos)``. Only the bytes asked for are copied, once (bytes chunks are joined
    through memoryviews), never the rest of a chunk."""
    pieces = [memoryview(buf)[pos:] if type(buf) is bytes else buf[pos:]]
    need = n - (len(buf) - pos)
    for chunk in chunks:
        if len(chunk) >= need:
            pieces.append(memoryview(chunk)[:need] if type(chunk) is bytes else chunk[:need])
            return b"".join(pieces), chunk, need
        pieces.append(chunk)
        need -= len(chunk)
    return b"".join(pieces), b"", 0


def _skip(chunks: Iterator[bytes], buf: bytes, pos: int, n: int) -> tuple[int, bytes, int]:
    """Pass over ``n`` bytes from ``buf[pos:]`` on without copying them: how many there
    were (fewer only at the end), and the new ``(buf, pos)``."""
    need = n - (len(buf) - pos)
    for chunk in chunks:
        if len(chunk) >= need:
            return n, chunk, need
        need -= len(chunk)
    return n - need, b"", 0


_ZERO_BLOCK = bytes(BLOCK_BYTES)


def _members(
    chunks: Iterator[bytes], url: str, offset: int, end_of_archive: bool, foreign: bool = False, payloads: bool = True
) -> Iterator[tuple[str, int, Any]]:
    # The buffer and position live in locals: a header or payload inside the current chunk
    # costs one slice, and only one that crosses chunks goes through _take.
    buf, pos = b"", 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    skipped: dict[str, int] = {}  # foreign shards: members that are not regular files, by kind
    while True:
        end = pos + BLOCK_BYTES
        if end <= len(buf):
            header, pos = buf[pos:end], end
        else:
            header, buf, pos = _take(chunks, buf, pos, BLOCK_BYTES)
        if len(header) < BLOCK_BYTES:
            between = long_name is None and not pax  # not inside a member's long name or PAX records
            _check_end(header, url, offset, end_of_archive=end_of_archive, foreign=foreign, between=between)
            _warn_skipped(url, skipped)
            return
        if header == _ZERO_BLOCK:
            _warn_skipped(url, skipped)
            return
        _check_sum(header, url, offset)
        typeflag = header[156:157]
        if typeflag == b"S" or (pax and not _SPARSE_KEYS.isdisjoint(pax)):
            raise _sparse_refused(header, long_name, pax, url, offset)
        size = _number(header[124:136], url=url, offset=offset)
        if pax and "size" in pax:
            size = int(pax["size"])
        data_offset = offset + BLOCK_BYTES
        padded = (size + 511) & ~511
        offset = data_offset + padded
        if typeflag in _FILE_TYPES:
            if "path" in pax:
                name = pax["path"]
            elif long_name is not None:
                name = long_name
            else:
                name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                if header[257:263] == b"ustar\0" and header[345] != 0:
                    prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                    name = f"{prefix}/{name}"
            long_name, pax = None, {}
            if name[:1] == "/" or (".." in name and ".." in name.split("/")):
                raise _path_refused(name, url, data_offset - BLOCK_BYTES)
            end = pos + padded
            if end <= len(buf):
                payload, pos = (buf[pos : pos + size] if payloads else size), end
                complete = True
            elif payloads:
                body, buf, pos = _take(chunks, buf, pos, padded)
                complete = len(body) == padded
                payload = body[:size] if padded != size else body
            else:
                skipped_bytes, buf, pos = _skip(chunks, buf, pos, padded)
                complete, payload = skipped_bytes == padded, size
            if not complete:
                raise CorruptShardError(
                    f"{url}: member {name!r} ends early (expected {size} bytes from byte "
                    f"{data_offset}); the shard is truncated, re-pack or re-upload it"
                )
            yield name, data_offset, payload
            continue
        end = pos + padded
        if end <= len(buf):
            body, pos = buf[pos:end], end
        else:
            body, buf, pos = _take(chunks, buf, pos, padded)
        if len(body) < padded:
            raise CorruptShardError(f"{url}: tar stream ends inside a record at byte {data_offset}")
        long_name, pax = _other_record(typeflag, body, size, long_name, pax, skipped, url, data_offset, foreign)


def _check_end(header: bytes, url: str, offset: int, *, end_of_archive: bool, foreign: bool, between: bool) -> None:
    """A stream that gave ``header``, short of a block, at byte ``offset``: return where it
    may end there (``between`` members, with no header read: a byte range, or a foreign shard
    without the end-of-archive blocks, which is logged), else raise CorruptShardError."""
    if header:
        raise CorruptShardError(
            f"{url}: truncated tar header at byte {offset}; the shard is incomplete, re-pack or re-upload it"
        )
    if not ((not end_of_archive or foreign) and between):
        raise CorruptShardError(
            f"{url}: ends at byte {offset} without the tar end-of-archive blocks; the shard "
            "is truncated (an interrupted copy?), re-pack or re-upload it"
        )
    if foreign and end_of_archive:
        log.warning(
            "%s: ends at byte %d, after a member, without the tar end-of-archive blocks; "
            "read as GNU tar and WebDataset read it",
            url,
            offset,
        )


def _sparse_refused(
    header: bytes, long_name: str | None, pax: dict[str, str], url: str, offset: int
) -> CorruptShardError:
    """The error for the sparse member whose header is at byte ``offset``."""
    name = pax.get("GNU.sparse.name") or long_name or header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return CorruptShardError(
        f"{url}: member {name!r} at byte {offset} is a sparse file (tar -S, or bsdtar on a file with "
        "holes), which shardstream does not expand; refused rather than read wrong. Re-create the shard "
        "without sparse members (GNU tar without -S; bsdtar --read-sparse off) or repack its files"
    )


def _path_refused(name: str, url: str, offset: int) -> CorruptShardError:
    """The error for member ``name`` (header at byte ``offset``), an absolute path or one with ``..``."""
    return CorruptShardError(
        f"{url}: member {name!r} at byte {offset} has an absolute path or "
        "'..'; refused (shards hold relative paths only: re-pack with shardstream pack)"
    )


def _other_record(
    typeflag: bytes,
    body: Any,
    size: int,
    long_name: str | None,
    pax: dict[str, str],
    skipped: dict[str, int],
    url: str,
    data_offset: int,
    foreign: bool,
) -> tuple[str | None, dict[str, str]]:
    """What a record other than a regular file leaves for the next member: its ``(long_name,
    pax)`` (a GNU long name or PAX records for it; a directory or a foreign shard's skipped
    link, device or FIFO, counted in ``skipped``, drops them).

    Raises:
        CorruptShardError: a link, device or FIFO in a shard that is not ``foreign``.
    """
    if typeflag == b"L":
        return body[:size].rstrip(b"\0").decode("utf-8", "surrogateescape"), pax
    if typeflag == b"x":
        return long_name, _pax_records(body[:size], url=url, offset=data_offset)
    if typeflag in _REFUSED_TYPES and foreign:
        skipped[_REFUSED_TYPES[typeflag]] = skipped.get(_REFUSED_TYPES[typeflag], 0) + 1
        return None, {}
    if typeflag in _REFUSED_TYPES:
        raise CorruptShardError(
            f"{url}: member at byte {data_offset - BLOCK_BYTES} is a {_REFUSED_TYPES[typeflag]}; refused "
            "(shards hold regular files only: re-pack with shardstream pack)"
        )
    if typeflag != b"g":  # a directory: skipped with its long name
        return None, {}
    return long_name, pax


def _warn_skipped(url: str, skipped: dict[str, int]) -> None:
    if skipped:
        kinds = ", ".join(f"{count} {kind}{'s' if count > 1 else ''}" for kind, count in sorted(skipped.items()))
        log.warning("%s: skipped %s (not regular files; never followed)", url, kinds)


def _check_sum(header: bytes, url: str, offset: int) -> None:
    """Raise CorruptShardError unless the header's checksum field matches its bytes.

    The sum of its 512 bytes comes from zlib's Adler-32 (whose low half is 1 + that sum,
    modulo 65,521), about 20 times faster than ``sum(header)``; where that says no, or the
    sum could wrap (a header of high bytes), the bytes are summed one by one."""
    field = header[148:156]
    stored = _number(field, url=url, offset=offset)
    expected = stored + sum(field) - 8 * 32  # the sum of all 512 bytes, if the header is intact
    if 0 <= expected < 65520 and zlib.adler32(header) & 0xFFFF == expected + 1:
        return
    actual = sum(header) - sum(field) + 8 * 32
    if stored != actual:
        raise CorruptShardError(
            f"{url}: tar header checksum mismatch at byte {offset} (stored {stored}, computed {actual}); the "
            "shard is corrupt, re-pack or re-upload it"
        )


def read_header(block: bytes, *, url: str, offset: int) -> tuple[str, int, bool]:
    """``(name, size, regular)`` of one 512-byte tar header block, by the rules
    :func:`iter_members_at` reads with: the name field and the ustar prefix (PAX and GNU
    long-name records before the block are not seen here); ``regular``: a regular file.

    Raises:
        CorruptShardError: the block fails its checksum or a number field is malformed.
    """
    _check_sum(block, url, offset)
    name = block[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    if block[257:263] == b"ustar\0" and block[345] != 0:
        name = block[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") + "/" + name
    return name, _number(block[124:136], url=url, offset=offset), block[156:157] in _FILE_TYPES


def iter_sample_batches(
    stream: ReadStream | ShardStream,
    *,
    url: str,
    end_of_archive: bool = True,
    batch_samples: int = 256,
    batch_bytes: int = 1 << 20,
    foreign: bool = False,
) -> Iterator[Any]:
    """:func:`iter_samples` in lists (:class:`Batch`, its ``nbytes``: the payload bytes of its
    samples) of up to ``batch_samples`` samples or about ``batch_bytes`` of payload; the first
    holds the first sample alone, so it is not kept waiting for the bytes of the next ones
    (from S3, 256 photos are 20 MB still on the wire). ``foreign`` as :func:`iter_members_at`."""
    batch, nbytes = Batch(), 0
    sample: dict[str, object] | None = None
    key = ""
    first = True
    members = iter_members_at(stream, url=url, end_of_archive=end_of_archive, foreign=foreign)
    try:
        for name, _, payload in members:
            slash = name.rfind("/")
            dot = name.find(".", slash + 2)
            if dot < 0:
                member_key, ext = name, ""
            else:
                member_key, ext = name[:dot], name[dot + 1 :]
            if member_key != key or sample is None:
                if ext in RESERVED_FIELDS:
                    raise CorruptShardError(f"{url}: member {name!r} uses reserved extension {ext!r}")
                if sample is not None:
                    batch.append(sample)
                    if len(batch) >= batch_samples or nbytes >= batch_bytes or first:
                        first = False
                        batch.nbytes = nbytes
                        yield batch
                        batch, nbytes = Batch(), 0
                key = member_key
                sample = {"__key__": key, "__shard__": url, ext: payload}
            else:
                if ext in sample or ext in RESERVED_FIELDS:
                    if ext in RESERVED_FIELDS:
                        raise CorruptShardError(f"{url}: member {name!r} uses reserved extension {ext!r}")
                    raise CorruptShardError(
                        f"{url}: sample {key!r} holds extension {ext!r} twice; members of a sample "
                        "must have distinct extensions"
                    )
                sample[ext] = payload
            nbytes += len(payload)
    except CorruptShardError:
        if batch:  # the samples before the damage, as they would have come one at a time
            batch.nbytes = nbytes
            yield batch
        raise
    if sample is not None:
        batch.append(sample)
    if batch:
        batch.nbytes = nbytes
        yield batch


def iter_samples(
    stream: ReadStream | ShardStream, *, url: str, end_of_archive: bool = True
) -> Iterator[dict[str, object]]:
    """Group consecutive members sharing a key into sample dicts (``end_of_archive`` as
    :func:`iter_members_at`: False for a byte range of a shard).

    Yields:
        ``{"__key__": key, "__shard__": url, ext: payload, ...}`` with ``payload`` as bytes.

    Raises:
        CorruptShardError: as :func:`iter_members`, or one sample holds the same extension
            twice, or an extension is a reserved field name.
    """
    for batch in iter_sample_batches(stream, url=url, end_of_archive=end_of_archive):
        yield from batch
