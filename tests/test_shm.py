"""Shared-memory files of a dataset: removed by their creator, and, when it was killed before
it could, by the next process that makes one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shardstream.storage.shm import SharedFile


def test_files_of_killed_creators_are_removed_and_no_others(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True, timeout=60
    )
    dead_pid = int(dead.stdout)
    first = SharedFile("shardstream-test", 64)
    folder = Path(first.path).parent
    orphan = folder / f"shardstream-test-{dead_pid}-0123456789ab"
    orphan.write_bytes(b"x")
    other = folder / f"shardstream-test-{dead_pid}-notours"
    other.write_bytes(b"y")
    try:
        second = SharedFile("shardstream-test", 64)
        assert not orphan.exists()  # its creator is gone
        assert Path(first.path).exists() and Path(second.path).exists()  # ours, alive
        assert other.exists()  # not a name the cache makes
        path = second.path
        del second
        assert not Path(path).exists()  # removed by its creator when collected
    finally:
        other.unlink()
