"""Shards other tools wrote, read without a shardstream index, compared with webdataset sample
by sample: links (GNU tar) are skipped with one warning per shard, never followed; a tar that
ends at a member boundary without its end-of-archive blocks is read with a warning."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

from shardstream import ShardDataset
from shardstream.errors import CorruptShardError


def webdataset_samples(url: str) -> list[dict]:
    out = []
    for sample in wds.WebDataset([url], shardshuffle=False, empty_check=False):
        out.append({k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"})
    return out


def ours(url: str) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "__shard__"} for s in ShardDataset([url], shuffle=False)]


def gnu_tar_with_links(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"{i:03d}.txt").write_text(f"text {i}")
        (src / f"{i:03d}.cls").write_text(str(i % 2))
    os.symlink("000.txt", src / "zzz.txt")  # a symbolic link
    os.link(src / "001.txt", src / "zzy.txt")  # a hard link: GNU tar stores the second name as a link
    shard = tmp_path / "links.tar"
    subprocess.run(["tar", "--sort=name", "-cf", str(shard), "-C", str(src), "."], check=True)
    return shard


def test_links_in_a_foreign_shard_are_skipped_with_one_warning(tmp_path, caplog):
    shard = gnu_tar_with_links(tmp_path)
    with tarfile.open(shard) as tar:
        kinds = sorted(m.type for m in tar.getmembers() if m.issym() or m.islnk())
    assert kinds == [tarfile.LNKTYPE, tarfile.SYMTYPE]  # the fixture holds both kinds of link
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        got = ours(str(shard))
    assert got == webdataset_samples(str(shard))  # webdataset skips links too
    assert [s["__key__"] for s in got] == [f"./{i:03d}" for i in range(6)]
    warnings = [r.getMessage() for r in caplog.records if "links.tar" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 1 hard link, 1 symbolic link" in warnings[0]


def test_links_in_a_packed_shard_are_still_refused(tmp_path):
    """With an index (a dataset shardstream packed), a link means the shard was changed."""
    from shardstream.tarstream import iter_members

    shard = gnu_tar_with_links(tmp_path)
    with pytest.raises(CorruptShardError, match=r"links.tar: member at byte \d+ is a (hard|symbolic) link; refused"):
        list(iter_members(open(shard, "rb"), url=str(shard)))


def test_a_tar_without_its_end_blocks_reads_with_a_warning(tmp_path, caplog):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(4):
            for ext, payload in (("jpg", os.urandom(700)), ("cls", b"1")):
                info = tarfile.TarInfo(f"{i:03d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
        end = buf.tell()  # the members end here; tarfile adds the end blocks on close
    shard = tmp_path / "cut.tar"
    shard.write_bytes(buf.getvalue()[:end])
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        got = ours(str(shard))
    assert got == webdataset_samples(str(shard))
    assert len(got) == 4
    assert any(
        f"cut.tar: ends at byte {end}, after a member, without the tar end-of-archive blocks" in r.getMessage()
        for r in caplog.records
    )
    (tmp_path / "mid.tar").write_bytes(buf.getvalue()[: end - 100])  # inside a member: still an error
    with pytest.raises(CorruptShardError, match="mid.tar: member '003.cls' ends early"):
        ours(str(tmp_path / "mid.tar"))


def plain_members(count: int = 5) -> list[tuple[str, bytes]]:
    return [
        (f"{i:03d}.{ext}", payload)
        for i in range(count)
        for ext, payload in (("jpg", os.urandom(900 + i)), ("json", b'{"i": %d}' % i))
    ]


def tar_bytes(members: list[tuple[str, bytes]], mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def test_gzip_shards_from_gnu_tar_tarfile_and_webdataset_read_as_webdataset_reads_them(tmp_path):
    members = plain_members()
    src = tmp_path / "src"
    src.mkdir()
    for name, payload in members:
        (src / name).write_bytes(payload)
    subprocess.run(["tar", "--sort=name", "-czf", str(tmp_path / "gnu.tar.gz"), "-C", str(src), "."], check=True)
    (tmp_path / "tarfile.tgz").write_bytes(tar_bytes(members, "w:gz"))
    with wds.TarWriter(str(tmp_path / "writer.tar.gz"), compress=True) as sink:
        for i in range(5):
            sink.write({"__key__": f"{i:03d}", "jpg": members[2 * i][1], "json": members[2 * i + 1][1]})
    (tmp_path / "misnamed.tar").write_bytes((tmp_path / "tarfile.tgz").read_bytes())  # told by content, not name
    for name in ("gnu.tar.gz", "tarfile.tgz", "writer.tar.gz", "misnamed.tar"):
        got = ours(str(tmp_path / name))
        assert len(got) == 5, name
        assert got == webdataset_samples(str(tmp_path / name)), name


def test_zstd_shards_and_concatenated_gzip(tmp_path):
    import gzip

    import zstandard

    members = plain_members()
    plain = tar_bytes(members)
    (tmp_path / "a.tar.zst").write_bytes(zstandard.ZstdCompressor().compress(plain))
    reference = [{"__key__": f"{i:03d}", "jpg": members[2 * i][1], "json": members[2 * i + 1][1]} for i in range(5)]
    assert ours(str(tmp_path / "a.tar.zst")) == reference
    cut = len(plain) // 2
    (tmp_path / "two.tar.gz").write_bytes(gzip.compress(plain[:cut]) + gzip.compress(plain[cut:]))  # as pigz/cat make
    assert ours(str(tmp_path / "two.tar.gz")) == reference
    (tmp_path / "short.tar.gz").write_bytes(gzip.compress(plain)[:-100])
    with pytest.raises(CorruptShardError, match="short.tar.gz: a gzip-compressed shard that does not decompress"):
        ours(str(tmp_path / "short.tar.gz"))


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_sparse_members_are_refused_naming_shard_and_member(tmp_path, fmt):
    """GNU tar -S stores a file with holes as a sparse member (GNU: type S; pax: GNU.sparse
    records and a GNUSparseFile.0/ name): refused, never lost or read as its sparse map."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "000.txt").write_text("before")
    with open(src / "001.bin", "wb") as f:
        f.write(b"head")
        f.seek(1 << 20)
        f.write(b"tail")  # a 1 MiB hole
    (src / "002.txt").write_text("after")
    shard = tmp_path / f"sparse-{fmt}.tar"
    subprocess.run(
        [
            "tar",
            "-S",
            f"--format={fmt}",
            "--sort=name",
            "-cf",
            str(shard),
            "-C",
            str(src),
            "000.txt",
            "001.bin",
            "002.txt",
        ],
        check=True,
    )
    with pytest.raises(CorruptShardError, match=rf"sparse-{fmt}.tar: member '.*001.bin' at byte \d+ is a sparse file"):
        ours(str(shard))
