"""Slicing samples by a shard's table (shardstream.reading.slicer): the same samples as parsing the
tar (tarfile as the reference reader) for tars written by tarfile in each format and by GNU
tar, from one mapped buffer or from pieces of any size; and a stale table, a damaged header
or a truncated stream is refused, naming the shard, member and byte."""

from __future__ import annotations

import io
import mmap
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shardstream import ShardDataset, open_index, pack
from shardstream.errors import CorruptShardError
from shardstream.format import split_key
from shardstream.index.table import ShardTable
from shardstream.reading import slicer
from shardstream.reading.slicer import RunSlices, iter_sliced_batches
from shardstream.tarstream import Pieces


def table_of(data: bytes, url: str = "mem.tar") -> ShardTable:
    """The sample table of a tar, from tarfile's own reading of it (the reference)."""
    samples: list[tuple[str, list[tuple[str, int, int]]]] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar:
            if not info.isreg():
                continue
            key, _ = split_key(info.name)
            if not samples or samples[-1][0] != key:
                samples.append((key, []))
            samples[-1][1].append((info.name, info.offset_data, info.size))
    return ShardTable.from_samples(url, samples)


def reference(data: bytes) -> list[dict]:
    """Samples as tarfile extracts them."""
    out: list[dict] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar:
            if info.isreg():
                key, ext = split_key(info.name)
                if not out or out[-1]["__key__"] != key:
                    out.append({"__key__": key, "__shard__": "mem.tar"})
                out[-1][ext] = tar.extractfile(info).read()
    return out


def sliced(data: bytes, table: ShardTable, chunks=None, samples=None) -> list[dict]:
    wanted = np.arange(table.num_samples) if samples is None else np.asarray(samples, np.int64)
    run = RunSlices(table, wanted, url="mem.tar")
    return [s for batch in iter_sliced_batches(chunks or [data], run) for s in batch]


def make_tar(members, fmt=tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def members(n: int, seed: int = 0) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append((f"d{i // 7}/{i:05d}.jpg", rng.randbytes(rng.choice([0, 1, 511, 512, 513, 3000]))))
        out.append((f"d{i // 7}/{i:05d}.cls", str(i % 5).encode()))
    return out


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_slices_what_tarfile_reads_in_every_format(fmt):
    long_names = [("x/" + "long" * 40 + ".txt", b"long name"), ("\u00fcber/\u00e4.json", b"{}")]
    data = make_tar(members(40) + (long_names if fmt != tarfile.USTAR_FORMAT else []), fmt)
    assert sliced(data, table_of(data)) == reference(data)


def cut(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` in 2 to 301 pieces of random sizes."""
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 300)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def as_parts(pieces: list[bytes], rng: random.Random) -> list[Pieces]:
    """``pieces`` grouped into parts of 1 to 40, as ranged GET bodies are handed on."""
    parts, at = [], 0
    while at < len(pieces):
        n = rng.randint(1, 40)
        parts.append(Pieces(pieces[at : at + n]))
        at += n
    return parts


@pytest.fixture(params=["numpy", "slices"])
def header_gather(request, monkeypatch):
    """Each way the headers of received pieces are gathered (by numpy from pieces holding many,
    by a slice each from pieces holding few), whatever the random pieces' sizes."""
    monkeypatch.setattr(slicer, "_GATHER_ROWS", 0 if request.param == "numpy" else 1 << 30)


def test_pieces_of_any_size_give_the_same_samples(header_gather):
    data = make_tar(members(60))
    table, expected = table_of(data), reference(data)
    rng = random.Random(1)
    for _ in range(20):
        assert sliced(data, table, chunks=cut(data, rng)) == expected


def test_pieces_grouped_as_ranged_get_bodies_give_the_same_samples(header_gather):
    """A shard as the S3 reader hands it on: parts (Pieces) of pieces of any size, so
    members and headers span pieces and parts; also a subset of the samples."""
    data = make_tar(members(60))
    table, expected = table_of(data), reference(data)
    rng = random.Random(2)
    for _ in range(20):
        parts = as_parts(cut(data, rng), rng)
        assert sliced(data, table, chunks=parts) == expected
        wanted = sorted(rng.sample(range(60), 7))
        assert sliced(data, table, chunks=parts, samples=wanted) == [expected[i] for i in wanted]


def test_headers_gathered_from_pieces_are_the_shards_bytes(header_gather):
    """The first bytes of each member's header, gathered from pieces of any size (a header
    inside a piece, across two, in a piece shorter than it) from wherever a part starts, are
    the shard's own bytes there."""
    data = make_tar(members(60))
    table = table_of(data)
    rng = random.Random(4)
    for _ in range(20):
        origin = int(rng.choice(table.offsets.tolist())) - 512  # a part starts at a header
        headers = table.offsets[table.offsets - 512 >= origin] - 512
        found = slicer._Spread(cut(data[origin:], rng), origin).heads(headers)
        want = b"".join(data[h : h + slicer.HEAD_BYTES] for h in headers.tolist())
        assert found.tobytes() == want


def test_every_header_is_checked_wherever_the_pieces_cut_it(header_gather):
    """Each member's header is checked, not a sample of them: one damaged name byte in any
    member's header (inside a piece, across two, at a part's edge) is refused, naming that
    header's byte, and the samples before it come out as tarfile reads them."""
    data = make_tar(members(60))
    table, expected = table_of(data), reference(data)
    rng = random.Random(3)
    rows = rng.sample(range(len(table.offsets)), 30)
    for row in rows:
        header = int(table.offsets[row]) - 512
        bad = bytearray(data)
        bad[header] ^= 0x20  # the name's first byte: "d" becomes "D"
        run = RunSlices(table, np.arange(table.num_samples), url="mem.tar")
        got: list[dict] = []
        with pytest.raises(CorruptShardError, match=rf"^mem\.tar: tar header checksum mismatch at byte {header}\b"):
            for batch in iter_sliced_batches(as_parts(cut(bytes(bad), rng), rng), run):
                got.extend(batch)
        before = int(np.searchsorted(table.member_start, row, side="right")) - 1  # the damaged member's sample
        assert got == expected[:before]


def test_a_shard_swapped_for_another_of_the_same_size_is_refused_in_pieces():
    """Another shard of the same size and layout in place of this one (only its names
    differ, from member 40 on, so its first headers agree with the table): refused at the
    first header that disagrees, naming both members."""
    ours = members(40, seed=4)
    theirs = ours[:40] + [(name.replace("d", "e", 1), payload) for name, payload in ours[40:]]
    data, other = make_tar(ours), make_tar(theirs)
    assert len(data) == len(other)
    table = table_of(data)
    header = int(table.offsets[40]) - 512
    rng = random.Random(5)
    for _ in range(10):
        with pytest.raises(
            CorruptShardError,
            match=rf"^mem\.tar: the tar header at byte {header} gives member 'e2/00020\.jpg' of \d+ bytes, "
            r"but the index says 'd2/00020\.jpg'",
        ):
            sliced(other, table, chunks=as_parts(cut(other, rng), rng))


def test_a_subset_of_samples_and_a_byte_range():
    data = make_tar(members(30))
    table, expected = table_of(data), reference(data)
    wanted = [2, 3, 9, 17, 29]
    assert sliced(data, table, samples=wanted) == [expected[i] for i in wanted]
    ends = table.sample_ends()
    start, end = int(ends[9]), int(ends[20])  # samples 10..20 as a range, in pieces
    run = RunSlices(table, np.arange(10, 21), url="mem.tar")
    part = data[start:end]
    got = [s for b in iter_sliced_batches([part[:1000], part[1000:]], run, base_offset=start) for s in b]
    assert got == expected[10:21]


def test_samples_with_different_members():
    data = make_tar(
        [
            ("a.jpg", b"1"),
            ("a.cls", b"2"),
            ("b.jpg", b"3"),
            ("c.txt", b"4"),
            ("c.json", b"5"),
            ("c.cls", b"6"),
            ("d", b"no extension"),
        ]
    )
    table = table_of(data)
    assert table.extensions is None
    assert sliced(data, table) == reference(data)


def test_gnu_tar_output_and_a_memory_map(tmp_path):
    if (
        shutil.which("tar") is None
        or "GNU" not in subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout
    ):
        pytest.fail("GNU tar is needed (it is part of every Linux image CI uses)")
    src = tmp_path / "src"
    for name, payload in members(25, seed=3):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(payload)
    subprocess.run(["tar", "-cf", str(tmp_path / "gnu.tar"), "-C", str(src), "."], check=True)
    data = (tmp_path / "gnu.tar").read_bytes()
    table = table_of(data)
    with open(tmp_path / "gnu.tar", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        got = sliced(data, table, chunks=[mapped])
    assert sorted(got, key=lambda s: s["__key__"]) == sorted(reference(data), key=lambda s: s["__key__"])


def test_another_writers_header_layout_is_read_by_the_tar_rules():
    """A header numpy does not read as format.py writes it (type NUL, a size with spaces) is
    checked by the tar parser's rules, and passes."""
    data = bytearray(make_tar(members(3)))
    table = table_of(bytes(data))
    header = int(table.offsets[0]) - 512
    data[header + 156] = 0  # type "\0": an old regular file
    size = int(table.sizes[0])
    data[header + 124 : header + 136] = f"{size:o}".rjust(11).encode() + b" "
    data[header + 148 : header + 156] = b" " * 8
    data[header + 148 : header + 156] = f"{sum(data[header : header + 512]):06o}".encode() + b"\0 "
    assert sliced(bytes(data), table) == reference(bytes(data))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("slicer") / "src"
    for name, payload in members(48, seed=5):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(payload)
    pack(src, src.parent / "ds", max_samples_per_shard=16, progress=False)
    return src.parent / "ds"


def test_a_stale_index_names_shard_member_and_byte(dataset, tmp_path):
    """Shard 1's bytes replaced by shard 2's (cut or padded to shard 1's size, so its size
    still agrees with the index): its first header disagrees with shard 1's table."""
    dest = tmp_path / "ds"
    shutil.copytree(dataset, dest)
    other = (dest / "data-000002.tar").read_bytes()
    (dest / "data-000001.tar").write_bytes(
        other[: (dest / "data-000001.tar").stat().st_size].ljust((dest / "data-000001.tar").stat().st_size, b"\0")
    )
    with pytest.raises(
        CorruptShardError,
        match=r"data-000001.tar: the tar header at byte \d+ gives member "
        r"'d4/00032\.\w+'.*but the index says 'd2/00016\.\w+'",
    ):
        list(ShardDataset(dest, shuffle=False))


def test_a_damaged_size_and_a_truncated_shard(dataset, tmp_path):
    dest = tmp_path / "ds"
    shutil.copytree(dataset, dest)
    table = open_index(dest).table(1)
    shard = dest / "data-000001.tar"
    data = bytearray(shard.read_bytes())
    header = int(table.offsets[5]) - 512
    data[header + 130] = ord("7") if data[header + 130] != ord("7") else ord("6")  # a size digit
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match=rf"data-000001.tar: tar header checksum mismatch at byte {header}"):
        list(ShardDataset(dest, shuffle=False))
    samples = list(ShardDataset(dest, shuffle=False, on_error="skip"))
    assert len(samples) == 48
    assert [s["__key__"] for s in samples[16:18]] == ["d2/00016", "d2/00017"]  # before the damaged member

    data = (dataset / "data-000001.tar").read_bytes()
    end = int(table.sample_ends()[9])
    run = RunSlices(table, np.arange(16), url="x.tar")
    with pytest.raises(CorruptShardError, match=r"x.tar: ends at byte \d+, but the index says sample 'd\d/00026' ends"):
        for _ in iter_sliced_batches([data[: end + 700]], run):
            pass
