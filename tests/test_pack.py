"""pack -> shards + index, checked byte for byte through ShardDataset, webdataset and GNU tar."""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

import pytest
import webdataset as wds
from conftest import all_files, packed_files
from webdataset.tariterators import base_plus_ext

from shardstream import Index, ShardDataset, open_index, pack
from shardstream.errors import (
    DestinationError,
    MemberNameError,
    SourceError,
    SourceNotFoundError,
    UnreadableFileError,
)
from shardstream.format import padded_size, split_key


@pytest.fixture(scope="module")
def packed(stdlib_tree, tmp_path_factory):
    dest = tmp_path_factory.mktemp("packed")
    report = pack(stdlib_tree, dest, max_shard_bytes=256 << 10, progress=False)
    return dest, report


def dataset_files(dest: Path) -> dict[str, bytes]:
    """The shards, index and report of a dataset directory (not the pack state)."""
    return {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}


def read_index(dest: Path) -> Index:
    return open_index(dest).as_v1()


def test_every_file_comes_back_through_shard_dataset(stdlib_tree, packed):
    dest, report = packed
    expected = packed_files(stdlib_tree)
    assert report.num_files == len(expected)
    empty = sorted(str(stdlib_tree / n) for n, data in expected.items() if not data)
    hidden = sorted(str(stdlib_tree / n) for n in all_files(stdlib_tree).keys() - expected.keys())
    no_suffix = sorted(str(stdlib_tree / n) for n in expected if "." not in n.rsplit("/", 1)[-1])
    assert hidden == [str(stdlib_tree / "extra/.config.json"), str(stdlib_tree / "extra/.hidden")]
    kinds = {"empty": empty, "hidden": hidden, "no_suffix": no_suffix}
    assert {k: sorted(p.path for p in report.problems if p.kind.value == k) for k in kinds} == kinds
    assert len(report.problems) == len(empty) + len(hidden) + len(no_suffix)
    assert all(p.packed == (p.kind.value != "hidden") for p in report.problems)  # reported; hidden ones left out
    got = {}
    for sample in ShardDataset(dest, shuffle=False):
        for ext, payload in sample.items():
            if ext.startswith("__"):
                continue
            name = sample["__key__"] + (f".{ext}" if ext else "")
            assert name not in got
            got[name] = payload
    assert got == expected


def test_every_file_comes_back_through_gnu_tar(stdlib_tree, packed, tmp_path):
    dest, _ = packed
    for shard in sorted(dest.glob("*.tar")):
        subprocess.run(["tar", "-xf", str(shard), "-C", str(tmp_path)], check=True)
    assert all_files(tmp_path) == packed_files(stdlib_tree)


def test_webdataset_reads_the_shards(stdlib_tree, packed):
    dest, _ = packed
    expected = packed_files(stdlib_tree)
    urls = [str(p) for p in sorted(dest.glob("*.tar"))]
    seen = 0
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        for ext, payload in sample.items():
            if ext.startswith("__"):
                continue
            assert expected[f"{sample['__key__']}.{ext}"] == payload
            seen += 1
    # webdataset skips the names its key rule cannot split (no dot in the file name)
    groupable = [n for n in expected if base_plus_ext(n)[0] is not None]
    assert seen == len(groupable) > 100 and len(groupable) < len(expected)


def test_index_describes_the_shards_exactly(stdlib_tree, packed):
    dest, report = packed
    index = read_index(dest)
    opened = open_index(dest)  # what pack wrote reads back, and writes back, byte for byte
    assert b"".join(opened.manifest.pieces()) == (dest / "index.bin").read_bytes()
    for i in range(opened.num_shards):
        table = opened.table(i)
        assert b"".join(table.pieces()) == (dest / (table.shard + ".samples")).read_bytes()
    files = packed_files(stdlib_tree)
    assert sorted(p.name for p in dest.glob("*.tar")) == [s.name for s in index.shards]
    assert [s.name for s in index.shards] == [f"data-{i:06d}.tar" for i in range(index.num_shards)]
    assert (index.num_members, index.num_shards) == (len(files), report.num_shards)
    for shard in index.shards:
        data = (dest / shard.name).read_bytes()
        assert len(data) == shard.bytes and f"{zlib.crc32(data):08x}" == shard.crc32
        # a shard exceeds the size limit only when it holds one sample that alone does
        assert shard.bytes <= 256 << 10 or shard.num_samples == 1
        for sample in shard.samples:
            for member in sample.members:
                assert split_key(member.name)[0] == sample.key
                assert data[member.offset : member.offset + member.size] == files[member.name]
    keys = [x.key for s in index.shards for x in s.samples]
    assert len(keys) == len(set(keys)), "members of a sample must stay together in one shard"
    # and a shard was closed only because the next sample would not fit
    for shard, following in zip(index.shards, index.shards[1:]):
        last_member = following.samples[0].members[-1]  # the next shard's first sample starts at 0
        assert shard.bytes + padded_size(last_member.offset + last_member.size) > 256 << 10


def test_same_input_gives_byte_identical_output(stdlib_tree, packed, tmp_path):
    dest, _ = packed
    pack(stdlib_tree, tmp_path, max_shard_bytes=256 << 10, progress=False)
    assert dataset_files(tmp_path) == dataset_files(dest)


def test_output_does_not_depend_on_the_process(stdlib_tree, packed, tmp_path):
    """Two packs in fresh interpreters with different hash seeds give the same bytes."""
    import sys

    dest, _ = packed
    for seed in ("1", "2"):
        out = tmp_path / seed
        code = f"from shardstream import pack; pack({str(stdlib_tree)!r}, {str(out)!r}, max_shard_bytes=256 << 10, progress=False)"
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert dataset_files(out) == dataset_files(dest)


def test_workers_are_forked_where_no_other_thread_runs_else_spawned(stdlib_tree, packed, tmp_path):
    """A script with no thread of its own gets forked workers (nothing imported again; a spawned
    worker runs the script's top level again as ``__mp_main__``); one running a thread gets
    spawned workers (a fork could inherit a held lock). Both write the one-worker bytes."""
    import sys

    dest, _ = packed
    script = tmp_path / "packer.py"
    script.write_text(
        "import os, sys, threading, time\n"
        "if __name__ == '__mp_main__':\n"
        "    open(os.path.join(sys.argv[2], f'imported-{os.getpid()}'), 'w').close()\n"
        "if __name__ == '__main__':\n"
        "    from shardstream import pack\n"
        "    if sys.argv[3] == 'thread':\n"
        "        stop = threading.Event()\n"
        "        threading.Thread(target=stop.wait, daemon=True).start()\n"
        f"    pack({str(stdlib_tree)!r}, sys.argv[1], max_shard_bytes=256 << 10, workers=2, progress=False)\n"
    )
    for mode, imports in (("alone", 0), ("thread", 2)):
        out, marks = tmp_path / mode, tmp_path / f"marks-{mode}"
        marks.mkdir()
        subprocess.run([sys.executable, str(script), str(out), str(marks), mode], check=True, timeout=300)
        assert len(list(marks.iterdir())) == imports, mode
        assert dataset_files(out) == dataset_files(dest), mode


def test_rotation_on_sample_count(stdlib_tree, tmp_path):
    report = pack(stdlib_tree / "json", tmp_path, max_samples_per_shard=2, progress=False)
    index = read_index(tmp_path)
    assert [s.num_samples for s in index.shards[:-1]] == [2] * (index.num_shards - 1)
    assert index.num_samples == report.num_samples == len(all_files(stdlib_tree / "json"))


def test_a_sample_larger_than_the_limit_gets_a_shard_of_its_own(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name, size in [("a.bin", 100), ("big.bin", 5000), ("c.bin", 100)]:
        (src / name).write_bytes(os.urandom(size))
    pack(src, tmp_path / "out", max_shard_bytes=3000, progress=False)
    index = read_index(tmp_path / "out")
    assert [[x.key for x in s.samples] for s in index.shards] == [["a"], ["big"], ["c"]]


def test_missing_and_empty_sources_are_errors(tmp_path):
    with pytest.raises(SourceNotFoundError, match="nope: no such directory"):
        pack(tmp_path / "nope", tmp_path / "out", progress=False)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(SourceError, match="holds no file to pack"):
        pack(tmp_path / "empty", tmp_path / "out", progress=False)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(SourceError, match="not a directory"):
        pack(tmp_path / "file", tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "index.bin").exists()


def test_destination_inside_source_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    for dest in (src / "out", src):
        with pytest.raises(DestinationError, match="is inside SOURCE .* pick a DEST outside SOURCE"):
            pack(src, dest, progress=False)
    assert sorted(os.listdir(src)) == ["a.txt"]


def test_two_files_with_the_same_key_and_extension_are_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("no dot")
    (src / "a.").write_text("trailing dot")
    with pytest.raises(MemberNameError, match=r"src/a\.': same member as '.*src/a' \('a', extension ''\); rename one"):
        pack(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "index.bin").exists()


def test_a_name_that_is_not_utf8_is_refused_with_the_file_named(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with open(os.fsencode(src) + b"/caf\xe9.txt", "wb") as f:
        f.write(b"latin-1 name")
    with pytest.raises(MemberNameError, match=r"caf\\udce9.txt'?: file name is not valid UTF-8"):
        pack(src, tmp_path / "out", progress=False)


def test_unwritable_destination_is_an_error(stdlib_tree, tmp_path):
    (tmp_path / "a-file").write_bytes(b"x")
    with pytest.raises(DestinationError, match="a-file/out: cannot write here"):
        pack(stdlib_tree / "json", tmp_path / "a-file" / "out", progress=False)


def test_an_existing_dataset_is_not_overwritten_by_accident(stdlib_tree, tmp_path):
    pack(stdlib_tree / "json", tmp_path, max_samples_per_shard=1, progress=False)
    assert len(list(tmp_path.glob("*.tar"))) > 1
    with pytest.raises(
        DestinationError,
        match=r"already holds a dataset \(max_samples_per_shard: 1 recorded, None given\); .* pass --overwrite to replace it",
    ):
        pack(stdlib_tree / "json", tmp_path, progress=False)
    pack(stdlib_tree / "email", tmp_path, overwrite=True, max_shard_bytes=1 << 30, progress=False)
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["data-000000.tar"]
    assert read_index(tmp_path).num_members == len(all_files(stdlib_tree / "email"))


def test_a_failed_overwrite_leaves_no_stale_index(stdlib_tree, tmp_path):
    pack(stdlib_tree / "json", tmp_path / "out", progress=False)
    make_unreadable_tree(tmp_path / "src")
    with pytest.raises(UnreadableFileError):
        pack(tmp_path / "src", tmp_path / "out", overwrite=True, max_samples_per_shard=1, progress=False)
    assert not list((tmp_path / "out").glob("*.tar")) and not (tmp_path / "out" / "index.bin").exists()


def make_unreadable_tree(root: Path) -> tuple[Path, Path]:
    """A tree with a file whose read fails (EIO even as root) and a broken symlink."""
    root.mkdir()
    (root / "good.txt").write_bytes(b"good")
    (root / "z").mkdir()
    (root / "z" / "also-good.txt").write_bytes(b"also good")
    bad_read = root / "bad.bin"
    bad_read.symlink_to("/proc/self/mem")
    broken = root / "z" / "broken.txt"
    broken.symlink_to(root / "missing-target")
    return bad_read, broken


def test_an_unreadable_file_stops_the_pack_and_publishes_nothing(tmp_path):
    bad_read, broken = make_unreadable_tree(tmp_path / "src")
    with pytest.raises(
        UnreadableFileError, match=rf"({bad_read}': cannot read|{broken}': broken symlink).*--on-error skip"
    ):
        pack(tmp_path / "src", tmp_path / "out", max_samples_per_shard=1, progress=False)
    assert not (tmp_path / "out" / "index.bin").exists()
    assert not list((tmp_path / "out").glob(".*.partial-*"))


def test_skip_unreadable_packs_the_rest_and_reports_each_file(tmp_path):
    bad_read, broken = make_unreadable_tree(tmp_path / "src")
    os.mkfifo(tmp_path / "src" / "z" / "fifo")
    report = pack(tmp_path / "src", tmp_path / "out", on_error="skip", progress=False)
    assert {(p.path, p.kind.value) for p in report.problems} == {
        (str(bad_read), "unreadable"),
        (str(broken), "unreadable"),
        (str(tmp_path / "src" / "z" / "fifo"), "not_regular"),
    }
    got = {s["__key__"]: s["txt"] for s in ShardDataset(tmp_path / "out", shuffle=False)}
    assert got == {"good": b"good", "z/also-good": b"also good"}
