"""Tar member naming, the key/extension rule, and deterministic tar headers.

A shard is a plain tar file (GNU format: long names use ``././@LongLink`` records) whose
members are the packed files, named by their path relative to the pack source, in sorted
order. Every header carries the same metadata (mtime 0, uid/gid 0, no user or group name,
mode 0644), so the same input always gives byte-identical shards. An archive ends with two
zero blocks and is not padded to a record size.

Samples follow the WebDataset convention: members whose names share a *key* form one
sample and are adjacent in one shard. The key is the member name up to the first dot of its
file name; the *extension* is the rest (``"train/cat/001.seg.png"`` -> key
``"train/cat/001"``, extension ``"seg.png"``). A dot that starts the file name belongs to the
key (``".hidden"`` -> key ``".hidden"``, extension ``""``), and a file name with no other dot
is a sample with one member of extension ``""``.
"""

from __future__ import annotations

import tarfile

__all__ = [
    "BLOCK_BYTES",
    "END_OF_ARCHIVE",
    "RESERVED_FIELDS",
    "SHARD_SUFFIXES",
    "member_header",
    "member_header_size",
    "padded_size",
    "split_key",
]

BLOCK_BYTES = 512
END_OF_ARCHIVE = bytes(2 * BLOCK_BYTES)
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst")  # names taken for shards (compression is told by content)
FIXED_MTIME = 0
FIXED_MODE = 0o644
RESERVED_FIELDS = frozenset({"__key__", "__shard__", "__url__"})


def split_key(member_name: str) -> tuple[str, str]:
    """Split a member name into ``(key, extension)`` by the WebDataset rule (module doc)."""
    slash = member_name.rfind("/")
    dot = member_name.find(".", slash + 2)
    if dot < 0:
        return member_name, ""
    return member_name[:dot], member_name[dot + 1 :]


def padded_size(size: int) -> int:
    """``size`` rounded up to whole 512-byte tar blocks."""
    return (size + BLOCK_BYTES - 1) // BLOCK_BYTES * BLOCK_BYTES


def _tarfile_header(member_name: str, size: int) -> bytes:
    info = tarfile.TarInfo(member_name)
    info.size = size
    info.mtime = FIXED_MTIME
    info.mode = FIXED_MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


_TEMPLATE = _tarfile_header("x", 0)
_MAX_FAST_SIZE = 8**11  # what 11 octal digits hold; larger sizes take tarfile's base-256 path
# The template cut around the fields a member changes: name [0:100], size [124:136], checksum
# [148:156]; the checksum is that of the rest (a constant) plus those fields' bytes.
_NAME_PAD = bytes(100)
_AFTER_NAME = _TEMPLATE[100:124]
_AFTER_SIZE = _TEMPLATE[136:148]
_AFTER_CHECKSUM = _TEMPLATE[156:BLOCK_BYTES]
_FIXED_SUM = sum(_AFTER_NAME) + sum(_AFTER_SIZE) + 8 * ord(" ") + sum(_AFTER_CHECKSUM)


def member_header(member_name: str, size: int) -> bytes:
    """The deterministic tar header block(s) of a regular file member.

    Common members (name of at most 100 UTF-8 bytes, size below 8 GiB) get a header joined
    from the pieces of a template made by :mod:`tarfile` (byte-identical to its output, many
    times faster); others go through :mod:`tarfile` itself.

    Args:
        member_name: the member's path inside the archive (UTF-8; undecodable bytes kept via
            ``surrogateescape``).
        size: payload size in bytes.

    Returns:
        512 bytes, or more when a GNU long-name record is needed.
    """
    encoded = member_name.encode("utf-8", "surrogateescape")
    if len(encoded) > 100 or size >= _MAX_FAST_SIZE:
        return _tarfile_header(member_name, size)
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + sum(encoded) + sum(size_field)
    return b"".join(
        (
            encoded,
            _NAME_PAD[len(encoded) :],
            _AFTER_NAME,
            size_field,
            _AFTER_SIZE,
            b"%06o\0 " % checksum,
            _AFTER_CHECKSUM,
        )
    )


def member_header_size(member_name: str, size: int) -> int:
    """``len(member_header(member_name, size))``, without making the header where it is one
    block (the common case)."""
    # 25 characters are at most 100 UTF-8 bytes (4 a character): no encoding needed to know
    if size < _MAX_FAST_SIZE and (len(member_name) <= 25 or len(member_name.encode("utf-8", "surrogateescape")) <= 100):
        return BLOCK_BYTES
    return len(member_header(member_name, size))
