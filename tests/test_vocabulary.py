"""One vocabulary and one reader of the environment, as a user and a contributor meet them:
writers take the readers' ``on_error="raise"`` (and keep their older ``"fail"``), in the
library and on the command line; and no module but ``shardstream.config`` reads the
environment (every variable read is listed in ``config.ENVIRONMENT``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import shardstream
from shardstream import pack, pack_samples
from shardstream.config import ENVIRONMENT, env, on_error_of
from shardstream.errors import MemberNameError, SampleFnError

pytestmark = pytest.mark.timeout(120)


def _tree_with_a_clash(root: Path) -> Path:
    src = root / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    (src / "b.txt").write_text("b")
    (src / "b.TXT").write_text("clash")  # same key and extension but for case: a bad input
    return src


@pytest.mark.parametrize("word", ["raise", "fail"])
def test_pack_stops_at_a_bad_input_under_either_word(tmp_path, word):
    src = _tree_with_a_clash(tmp_path)
    with pytest.raises(MemberNameError, match="b"):
        pack(src, tmp_path / "ds", on_error=word, progress=False)


def _fn(i):
    if i == 2:
        raise RuntimeError("input 2 is bad")
    return {"__key__": f"k{i}", "txt": str(i)}


@pytest.mark.parametrize("word", ["raise", "fail"])
def test_pack_samples_stops_at_a_bad_input_under_either_word(tmp_path, word):
    with pytest.raises(SampleFnError, match="input 2 is bad"):
        pack_samples(_fn, range(4), tmp_path / "ds", on_error=word, progress=False)


def test_the_command_line_takes_raise_and_skip(tmp_path):
    src = _tree_with_a_clash(tmp_path)
    cli = [sys.executable, "-m", "shardstream.cli", "pack", str(src)]
    failed = subprocess.run(
        [*cli, str(tmp_path / "a"), "--on-error", "raise"], capture_output=True, text=True, timeout=60
    )
    assert failed.returncode == 1 and "b" in failed.stderr
    skipped = subprocess.run(
        [*cli, str(tmp_path / "b"), "--on-error", "skip"], capture_output=True, text=True, timeout=60
    )
    assert skipped.returncode == 0, skipped.stderr
    assert (tmp_path / "b" / "pack-report.jsonl").read_text().count("\n") >= 1


def test_readers_refuse_the_writers_old_word_by_name():
    with pytest.raises(ValueError, match="on_error='fail' must be 'raise' or 'skip'"):
        on_error_of("fail", where="ShardDataset", old=())
    assert on_error_of("fail", where="pack") == "raise" and on_error_of("skip", where="pack") == "skip"


def test_only_config_reads_the_environment():
    package = Path(shardstream.__file__).parent
    readers = []
    for path in package.rglob("*.py"):
        if (path.name == "config.py" and path.parent == package) or "testing" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("environ", "getenv")
                and getattr(node.value, "id", None) == "os"
            ):
                readers.append(f"{path.relative_to(package)}:{node.lineno}")
    assert readers == []


def test_a_variable_not_listed_cannot_be_read():
    assert "LOCAL_WORLD_SIZE" in ENVIRONMENT and "HF_TOKEN" in ENVIRONMENT
    with pytest.raises(KeyError, match="ENVIRONMENT"):
        env("SHARDSTREAM_SOMETHING_NEW")
