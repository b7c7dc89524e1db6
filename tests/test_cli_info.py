"""`shardstream info` and `verify` given something that is not a dataset (a shard, a folder of
files, a path that does not exist) say so in one line and exit 2; `info` lists a labelled
dataset's classes, a long list cut to its first and last ten."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardstream import pack

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))
INSTEAD = "pass a dataset's directory (what shardstream pack wrote) or its index.bin"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARDSTREAM, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """``ds/``: a dataset; ``files/``: files, no dataset; ``tars/``: a shard without an index."""
    root = tmp_path_factory.mktemp("cli-info")
    (root / "files" / "sub").mkdir(parents=True)
    (root / "files" / "a.txt").write_text("a")
    pack(root / "files", root / "ds", progress=False)
    (root / "tars").mkdir()
    (root / "tars" / "x.tar").write_bytes((root / "ds" / "data-000000.tar").read_bytes())
    return root


@pytest.mark.parametrize("command", ["info", "verify"])
@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            "ds/data-000000.tar",
            "ds/data-000000.tar is one shard of a dataset; pass the dataset's directory (ds) or its index "
            "(ds/index.bin)",
        ),
        (
            "tars/x.tar",
            "tars/x.tar is a tar shard and tars holds no index; index the shards first (shardstream index build "
            "tars), then pass tars",
        ),
        ("files", f"files holds no index.bin, so it is not a dataset; {INSTEAD}"),
        (
            "tars",
            f"tars holds no index.bin, so it is not a dataset; {INSTEAD} (to index the tar shards it holds: "
            "shardstream index build tars)",
        ),
        ("files/a.txt", f"files/a.txt is a file, not a dataset; {INSTEAD}"),
        ("no/such/dir", f"no/such/dir: no such file or directory; {INSTEAD}"),
    ],
)
def test_what_is_not_a_dataset_is_one_line_and_exit_2(workdir, command, given, line):
    done = run(command, given, cwd=workdir)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"shardstream: error: {line}\n")


def test_the_dataset_itself_is_fine_given_any_way(workdir):
    for given in ("ds", "ds/", "ds/index.bin"):
        assert run("info", given, cwd=workdir).returncode == 0
        assert run("verify", given, "--no-progress", cwd=workdir).returncode == 0


def many_classes(root: Path, count: int) -> Path:
    for i in range(count):
        (root / f"class{i:02d}").mkdir(parents=True)
        for j in range(i % 3 + 1):
            (root / f"class{i:02d}" / f"{j}.txt").write_text(f"{i} {j}")
    return root


def test_info_lists_the_first_and_last_ten_classes_or_every_one(tmp_path):
    pack(many_classes(tmp_path / "src", 25), tmp_path / "ds", labels_from_dirs=True, progress=False)
    done = run("info", str(tmp_path / "ds"))
    assert done.returncode == 0, done.stderr
    rows = [f"  {i:>2}  class{i:02d}  {i % 3 + 1}" for i in range(25)]
    head = "25 classes (class index, name, samples); samples per class: min 1, median 2, max 3"
    more = "  ...  5 more classes (shardstream info --all-classes lists every one)"
    assert done.stdout.splitlines()[3:] == [head, *rows[:10], more, *rows[15:]]
    every = run("info", "--all-classes", str(tmp_path / "ds"))
    assert every.stdout.splitlines()[3:] == [head, *rows]


def test_info_of_a_dataset_without_classes_says_nothing_of_them(workdir):
    done = run("info", "ds", cwd=workdir)
    assert done.returncode == 0 and "classes" not in done.stdout and len(done.stdout.splitlines()) == 3


def test_a_reader_that_stops_early_gets_no_traceback(workdir):
    """`shardstream info DEST | head -1`: the pipe's reader is gone before info writes, and the
    command ends quietly with 141 (128 + SIGPIPE) instead of a BrokenPipeError traceback."""
    process = subprocess.Popen(
        [SHARDSTREAM, "info", str(workdir / "ds")], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # before the interpreter has even started: its first write meets EPIPE
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert stderr == ""
