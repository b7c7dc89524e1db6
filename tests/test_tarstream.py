import io
import tarfile

import pytest

from shardstream.errors import CorruptShardError
from shardstream.format import END_OF_ARCHIVE, member_header, padded_size
from shardstream.tarstream import iter_members, iter_samples


def make_tar(members, fmt=tarfile.PAX_FORMAT, with_dirs=False):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        if with_dirs:
            info = tarfile.TarInfo("somedir")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


MEMBERS = [
    ("a/0001.jpg", b"jpeg-bytes" * 100),
    ("a/0001.cls", b"3"),
    ("a/0002.jpg", b""),
    ("b/" + "long" * 40 + ".txt", "\u00e9t\u00e9".encode()),
    ("\u00fcber/\u00e4.json", b"{}"),
]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_reads_tars_written_by_tarfile_in_every_format(fmt):
    members = MEMBERS if fmt != tarfile.USTAR_FORMAT else [m for m in MEMBERS if len(m[0]) < 100]
    data = make_tar(members, fmt=fmt, with_dirs=True)
    got = list(iter_members(io.BytesIO(data), url="mem.tar"))
    assert got == members


def test_groups_consecutive_members_into_samples():
    data = make_tar(MEMBERS)
    samples = list(iter_samples(io.BytesIO(data), url="mem.tar"))
    assert [s["__key__"] for s in samples] == ["a/0001", "a/0002", "b/" + "long" * 40, "\u00fcber/\u00e4"]
    assert samples[0] == {"__key__": "a/0001", "__shard__": "mem.tar", "jpg": MEMBERS[0][1], "cls": b"3"}


def test_checksum_mismatch_names_the_shard_and_offset():
    data = bytearray(make_tar(MEMBERS))
    data[512 + padded_size(len(MEMBERS[0][1])) + 10] ^= 0xFF  # second header's name
    with pytest.raises(CorruptShardError, match=r"s3://b/x\.tar: tar header checksum mismatch at byte 1536"):
        list(iter_members(io.BytesIO(bytes(data)), url="s3://b/x.tar"))


@pytest.mark.parametrize("cut", [0, 100, 512 + 10, 600, 1536, 2048])
def test_truncated_shards_raise(cut):
    """Cut inside a header, inside a payload, and at block boundaries (as an interrupted
    copy leaves it): all raise, none ends quietly with samples missing."""
    data = member_header("k.bin", 1000) + bytes(1024) + member_header("l.bin", 10) + bytes(512) + END_OF_ARCHIVE
    with pytest.raises(CorruptShardError, match="x.tar"):
        list(iter_members(io.BytesIO(data[:cut]), url="x.tar"))


def test_duplicate_extension_in_a_sample_is_an_error():
    data = make_tar([("k.txt", b"1"), ("k.txt", b"2")])
    with pytest.raises(CorruptShardError, match="'k' holds extension 'txt' twice"):
        list(iter_samples(io.BytesIO(data), url="x.tar"))


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (tarfile.SYMTYPE, "is a symbolic link; refused"),
        (tarfile.LNKTYPE, "is a hard link; refused"),
        (tarfile.CHRTYPE, "is a character device; refused"),
        (tarfile.BLKTYPE, "is a block device; refused"),
        (tarfile.FIFOTYPE, "is a FIFO; refused"),
    ],
)
def test_links_and_devices_are_refused(kind, message):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(tarfile.TarInfo("ok.txt"), io.BytesIO(b""))
        info = tarfile.TarInfo("evil")
        info.type = kind
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(CorruptShardError, match=rf"x.tar: member at byte 512 {message}"):
        list(iter_members(io.BytesIO(buf.getvalue()), url="x.tar"))


@pytest.mark.parametrize("name", ["/etc/passwd.txt", "a/../../b.txt", "../up.txt"])
def test_absolute_and_parent_paths_are_refused(name):
    data = make_tar([(name, b"x")])
    with pytest.raises(CorruptShardError, match="absolute path or '..'; refused"):
        list(iter_members(io.BytesIO(data), url="x.tar"))
