"""The default (WebDataset) grouping merges nothing silently: a key that gathers files differing
only by an extra dot part (``a.JPEG`` with ``a.b.JPEG``) is packed as one sample and reported, in
``pack-report.jsonl``, on stderr and in the summary line; files differing only in case collide and
are reported the same ways. Exact words."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from shardstream import pack
from shardstream.packing import listing

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))
SPEED = r"in \d+\.\d s: \d+ files/s, \d+\.\d MB/s"


def merged_reason(key: str, first: str, second: str, ext1: str, ext2: str) -> str:
    return (
        f"key {key!r} gathers 2 files that differ only by an extra dot part, {first!r} and {second!r}: packed as one "
        f"sample with members {ext1!r} and {ext2!r} (the WebDataset rule); if they are different files, rename one "
        "(a tree of class folders: pack it with --labels-from-dirs)"
    )


def run_pack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SHARDSTREAM, "pack", *args, "--no-progress", "--workers", "1"], capture_output=True, text=True, timeout=120
    )


def report_lines(dest: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (dest / "pack-report.jsonl").read_text().splitlines()]


def test_a_key_gathering_an_extra_dot_part_is_packed_as_one_sample_and_reported(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "a.JPEG").write_bytes(b"first")
    (src / "a.b.JPEG").write_bytes(b"second")
    (src / "c.txt").write_bytes(b"alone")
    done = run_pack(str(src), str(dest))
    assert done.returncode == 0, done.stderr
    reason = merged_reason("a", "a.JPEG", "a.b.JPEG", "JPEG", "b.JPEG")
    assert done.stderr == f"warning: {src}/a.JPEG: {reason}\n"
    assert re.fullmatch(
        rf"packed 3 files \(2 samples, 0\.0 MB\) into 1 shard {SPEED}; 0 skipped, 1 warning: 1 key gathers files "
        rf"that differ only by an extra dot part \(see {re.escape(str(dest))}/pack-report\.jsonl\); index "
        rf"{re.escape(str(dest))}/index\.bin: 1 shard, 2 samples\n",
        done.stdout,
    ), done.stdout
    assert report_lines(dest) == [{"path": f"{src}/a.JPEG", "kind": "merged", "reason": reason, "packed": True}]
    with tarfile.open(dest / "data-000000.tar") as tar:  # packed as today: one sample, as WebDataset groups it
        assert tar.getnames() == ["a.JPEG", "a.b.JPEG", "c.txt"]


def test_names_that_differ_only_in_case_collide_and_are_reported(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "x.JPG").write_bytes(b"upper")
    (src / "x.jpg").write_bytes(b"lower")
    (src / "y.txt").write_bytes(b"y")
    reason = f"same member as '{src}/x.JPG' ('x', extension 'jpg'); rename one"
    failed = run_pack(str(src), str(dest))
    assert failed.returncode == 1
    assert failed.stderr == (
        f"shardstream: error: '{src}/x.jpg': {reason}; fix it and run the same command again to resume, or pass "
        "--on-error skip to pack the rest and report it\n"
    )
    done = run_pack(str(src), str(dest), "--on-error", "skip")
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"not packed: {src}/x.jpg: {reason}\n"
    assert re.fullmatch(
        rf"packed 2 files \(2 samples, 0\.0 MB\) into 1 shard {SPEED}; 1 skipped, 0 warnings: 1 file collides with "
        rf"another \(same sample and member, e\.g\. names that differ only in case\) \(see "
        rf"{re.escape(str(dest))}/pack-report\.jsonl\); index {re.escape(str(dest))}/index\.bin: 1 shard, 2 samples\n",
        done.stdout,
    ), done.stdout
    assert report_lines(dest) == [{"path": f"{src}/x.jpg", "kind": "collision", "reason": reason, "packed": False}]


def test_both_kinds_in_one_tree_are_counted_apart(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for name in ("a.JPEG", "a.b.jpeg", "d/k.png", "d/k.seg.PNG", "d/k.seg.png", "x.JPG", "x.jpg"):
        (src / name).write_bytes(name.encode())
    report = pack(src, tmp_path / "out", on_error="skip", progress=False)
    assert sorted((Path(p.path).name, p.kind.value) for p in report.problems) == [
        ("a.JPEG", "merged"),
        ("k.png", "merged"),
        ("k.seg.png", "collision"),
        ("x.jpg", "collision"),
    ]
    assert (
        "; 2 skipped, 2 warnings: 2 keys gather files that differ only by an extra dot part; 2 files collide with "
        "others (same sample and member, e.g. names that differ only in case) (see "
    ) in report.summary()


def test_files_from_lists_are_grouped_and_reported_alike(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.JPEG", "a.b.JPEG"):
        (src / name).write_bytes(b"x")
    (tmp_path / "list.txt").write_text("a.JPEG\na.b.JPEG\n")
    report = pack(src, tmp_path / "out", files_from=tmp_path / "list.txt", progress=False)
    assert [(p.path, p.kind.value, p.reason) for p in report.problems] == [
        (f"{src}/a.JPEG", "merged", merged_reason("a", "a.JPEG", "a.b.JPEG", "JPEG", "b.JPEG"))
    ]


def test_beyond_the_first_of_a_kind_one_entry_counts_the_rest(tmp_path, monkeypatch):
    """Where every sample gathers such files (a segmentation set's x.png and x.seg.png), the
    report lists the first WARNINGS_LISTED one by one and counts the others in one entry."""
    monkeypatch.setattr(listing, "WARNINGS_LISTED", 2)
    src, dest = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.png").write_bytes(b"image")
        (src / f"{i}.seg.png").write_bytes(b"mask")
    report = pack(src, dest, progress=False)
    lines = report_lines(dest)
    assert [(Path(str(line["path"])).name, line.get("count", 1)) for line in lines] == [
        ("0.png", 1),
        ("1.png", 1),
        ("src", 3),
    ]
    assert lines[-1]["reason"] == "3 more like the 2 listed above (not listed one by one)"
    assert (
        "; 0 skipped, 5 warnings: 5 keys gather files that differ only by an extra dot part (see " in report.summary()
    )


@pytest.mark.parametrize("names", [("a.jpg", "b.jpg"), ("a.tar.gz", "a.txt"), ("a.seg.png", "a.jpg")])
def test_keys_whose_members_end_differently_are_not_reported(tmp_path, names):
    src = tmp_path / "src"
    src.mkdir()
    for name in names:
        (src / name).write_bytes(b"x")
    assert pack(src, tmp_path / "out", progress=False).problems == ()
