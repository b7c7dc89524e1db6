"""The fast paths of pack's writer give the bytes of the plain ones: ISA-L's CRC-32 against
zlib's, a local shard's writes gathered in runs against one write per sample, the tar headers
joined from a template against :mod:`tarfile`'s; the CRC-32 the index records is zlib's of the
shard file; and a pack stopped mid-shard resumes to the dataset a pack never stopped gives."""

from __future__ import annotations

import os
import random
import tarfile
import zlib
from pathlib import Path

import pytest
from conftest import all_files

import shardstream.packing.stream as stream_module
import shardstream.packing.writer as writer_module
from shardstream import ShardWriter, open_index, pack
from shardstream.errors import UnreadableFileError
from shardstream.format import member_header, member_header_size
from shardstream.packing.sources import ProblemKind, SourceFile
from shardstream.packing.stream import _read_file


def odd_tree(root: Path) -> Path:
    """Files of every size class around the 512-byte block, multi-member samples, empty files,
    nested folders, non-ASCII names and names past tar's 100 bytes (GNU long-name records)."""
    rng = random.Random(5)
    for d in range(3):
        for i in range(60):
            folder = root / f"d{d}" / ("nested/deeper" if i % 4 == 0 else "")
            folder.mkdir(parents=True, exist_ok=True)
            size = rng.choice([0, 1, 511, 512, 513, 4096, 20_000, rng.randrange(100_000)])
            (folder / f"{i:04d}.jpg").write_bytes(rng.randbytes(size))
            (folder / f"{i:04d}.cls").write_text(str(d))
            if i % 6 == 0:
                (folder / f"{i:04d}.seg.png").write_bytes(rng.randbytes(rng.randrange(3000)))
            if i % 20 == 0:
                (folder / ("L" * 110 + f"{i}.txt")).write_bytes(b"a long name")
                (folder / f"été ü {i}.bin").write_bytes(rng.randbytes(100))
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return odd_tree(tmp_path_factory.mktemp("src"))


def pack_with(src: Path, dest: Path, monkeypatch, *, crc=None, flush_bytes=None, **kwargs) -> dict[str, bytes]:
    with monkeypatch.context() as m:
        if crc is not None:
            m.setattr(writer_module, "crc32", crc)
        if flush_bytes is not None:
            m.setattr(writer_module, "_FLUSH_BYTES", flush_bytes)
        pack(src, dest, workers=1, max_shard_bytes=300_000, progress=False, **kwargs)
    return all_files(dest)


def test_isal_crc_and_gathered_writes_give_the_bytes_of_zlib_and_one_write_per_sample(tree, tmp_path, monkeypatch):
    fast = pack_with(tree, tmp_path / "fast", monkeypatch)
    plain = pack_with(tree, tmp_path / "plain", monkeypatch, crc=zlib.crc32, flush_bytes=1)
    assert len([n for n in fast if n.endswith(".tar")]) > 3
    assert fast == plain
    shuffled = pack_with(tree, tmp_path / "fast-shuffled", monkeypatch, shuffle=True)
    assert shuffled == pack_with(tree, tmp_path / "plain-shuffled", monkeypatch, shuffle=True, crc=zlib.crc32)


def test_the_recorded_crc_is_zlibs_of_each_shard_file(tree, tmp_path):
    dest = tmp_path / "ds"
    pack(tree, dest, workers=2, max_shard_bytes=300_000, progress=False)
    manifest = open_index(dest).manifest
    names = list(manifest.names())
    assert len(names) > 3
    for i, name in enumerate(names):
        data = (dest / name).read_bytes()
        assert manifest.crc32_hex(i) == f"{zlib.crc32(data):08x}", name
        assert int(manifest.shard_bytes[i]) == len(data)
        with tarfile.open(dest / name) as archive:  # GNU tar's reader takes every header
            assert all(m.isfile() for m in archive.getmembers())


def test_shard_writer_gives_the_same_bytes_with_either_crc(tmp_path, monkeypatch):
    def write(dest: Path) -> dict[str, bytes]:
        rng = random.Random(2)
        with ShardWriter(dest, max_shard_bytes=50_000) as writer:
            for i in range(200):
                writer.write({"__key__": f"k{i:04d}", "bin": rng.randbytes(rng.randrange(2000)), "cls": i % 7})
        return all_files(dest)

    fast = write(tmp_path / "fast")
    monkeypatch.setattr(writer_module, "crc32", zlib.crc32)
    monkeypatch.setattr(writer_module, "_FLUSH_BYTES", 1)
    assert write(tmp_path / "plain") == fast


def test_headers_joined_from_the_template_are_tarfiles(tmp_path):
    rng = random.Random(3)
    alphabet = "ab/._-é日x"
    for _ in range(3000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 20, 99, 100, 101, 150])))
        size = rng.choice([0, 1, 511, 512, rng.randrange(1 << 40), 8**11 - 1, 8**11])
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
        expected = info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
        assert member_header(name, size) == expected, (name, size)
        assert member_header_size(name, size) == len(expected)


def test_reading_a_file_reports_as_before(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    (tmp_path / "e.bin").write_bytes(b"")
    (tmp_path / "d.bin").mkdir()
    assert _read_file(SourceFile("a.bin", str(tmp_path / "a.bin"), 1000), None) == (b"x" * 1000, None)
    data, problem = _read_file(SourceFile("e.bin", str(tmp_path / "e.bin"), 0), None)
    assert data == b"" and problem.kind is ProblemKind.EMPTY
    data, problem = _read_file(SourceFile("a.bin", str(tmp_path / "a.bin"), 999), None)
    assert data == b"x" * 1000 and problem.kind is ProblemKind.RESIZED
    data, problem = _read_file(SourceFile("g.bin", str(tmp_path / "gone.bin"), 5), None)
    assert data is None and problem.kind is ProblemKind.VANISHED
    data, problem = _read_file(SourceFile("d.bin", str(tmp_path / "d.bin"), 5), None)
    assert data is None and problem.kind is ProblemKind.UNREADABLE
    assert problem.reason == "cannot read: Is a directory"


def test_a_pack_stopped_mid_shard_resumes_to_the_bytes_of_one_never_stopped(tree, tmp_path, monkeypatch):
    """Stopped by a file gone after the listing (its shard in progress dropped, gathered writes
    and all), then the file put back: the same pack finishes byte-identical to a clean one."""
    src = tmp_path / "src"
    src.mkdir()
    for path in sorted(tree.rglob("*")):
        if path.is_file():
            (src / path.relative_to(tree)).parent.mkdir(parents=True, exist_ok=True)
            (src / path.relative_to(tree)).write_bytes(path.read_bytes())
    victim = sorted(src.rglob("*.jpg"))[-5]
    kept = victim.read_bytes()
    dest = tmp_path / "resumed"
    real_read = stream_module._read_local

    def vanishing(path: str):
        if path == str(victim):
            raise FileNotFoundError(path)
        return real_read(path)

    with monkeypatch.context() as m:
        m.setattr(stream_module, "_read_local", vanishing)
        with pytest.raises(UnreadableFileError, match="vanished before it was read"):
            pack(src, dest, workers=1, max_shard_bytes=300_000, progress=False)
    assert not (dest / "index.bin").exists() and any(dest.glob("*.tar"))
    assert victim.read_bytes() == kept
    pack(src, dest, workers=1, max_shard_bytes=300_000, progress=False)
    pack(src, tmp_path / "clean", workers=1, max_shard_bytes=300_000, progress=False)
    assert all_files(dest) == all_files(tmp_path / "clean")
    assert not [n for n in os.listdir(dest) if ".partial-" in n]
