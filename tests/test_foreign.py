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
    assert any(f"cut.tar: ends at byte {end}, after a member, without the tar end-of-archive blocks" in r.getMessage()
               for r in caplog.records)
    (tmp_path / "mid.tar").write_bytes(buf.getvalue()[: end - 100])  # inside a member: still an error
    with pytest.raises(CorruptShardError, match="mid.tar: member '003.cls' ends early"):
        ours(str(tmp_path / "mid.tar"))
