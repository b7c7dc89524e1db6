"""`shardstream` on the command line, by its exact words and exit codes: usage errors (--workers
0, --part 3/2, `index` without a command), Ctrl-C (130), and the part a SLURM job array's task
packs (SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT, shardstream/packing/parts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from test_cli import SHARDSTREAM, run

PACK_USAGE = "usage: shardstream pack [-h] [--name NAME] [--shard-size SIZE]"


def make_files(root: Path, count: int, per_dir: int = 500) -> set[str]:
    """``count`` one-line files in folders of ``per_dir``; their paths under ``root``."""
    names = {f"d{i // per_dir:02d}/{i:05d}.txt" for i in range(count)}
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"file {name}\n")
    return names


def members(dest: Path, shards: set[str] | None = None) -> list[str]:
    """The member names of the shards ``dest/*.tar`` (or of the ``shards`` named), all of them."""
    names = []
    for shard in sorted(dest.glob("*.tar")):
        if shards is None or shard.name in shards:
            with tarfile.open(shard) as tar:
                names += tar.getnames()
    return names


def slurm_env(task_id: str, count: str, **array: str) -> dict[str, str]:
    """This environment (isolation scrubbed RANK, WORLD_SIZE and SLURM_*) with a job array task's
    variables; ``array`` adds SLURM_ARRAY_TASK_<NAME> (MIN, MAX, STEP, as SLURM sets them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE") and not k.startswith("SLURM_")}
    extra = {f"SLURM_ARRAY_TASK_{name.upper()}": value for name, value in array.items()}
    return {**env, "SLURM_ARRAY_TASK_ID": task_id, "SLURM_ARRAY_TASK_COUNT": count, **extra}


@pytest.mark.parametrize(
    ("option", "line"),
    [
        (["--workers", "0"], "shardstream pack: error: argument --workers: '0' must be an integer > 0"),
        (
            ["--part", "3/2"],
            "shardstream pack: error: argument --part: part '3/2' must be I/N with 0 <= I < N: parts count "
            "from 0, the 2 parts are 0/2 to 1/2",
        ),
        (
            ["--part", "1/0"],
            "shardstream pack: error: argument --part: part '1/0' must be I/N with 0 <= I < N, e.g. 0/2",
        ),
        (["--part", "x"], "shardstream pack: error: argument --part: part 'x' must be I/N with 0 <= I < N, e.g. 0/2"),
    ],
)
def test_pack_usage_errors_exit_2_with_the_usage_and_one_error_line(tmp_path, option, line):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    result = run("pack", str(tmp_path / "src"), str(tmp_path / "out"), *option)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith(PACK_USAGE) and lines[-1] == line
    assert result.stdout == "" and not (tmp_path / "out").exists()


def test_index_without_a_command_names_the_commands_and_exits_2():
    result = run("index")
    assert result.returncode == 2
    assert result.stderr == (
        "shardstream: error: `shardstream index` needs a command: build SHARDS..., merge DEST, upgrade DEST, "
        "keys DEST, or --dali DEST\n"
    )
    assert result.stdout == ""


@pytest.mark.slow  # two packs of 3,000 shards, each with 2 spawned workers (5-12 s here): not the inner loop
def test_ctrl_c_stops_a_pack_and_its_workers_with_130_and_the_same_command_finishes(tmp_path, reap_killed_semaphores):
    """SIGINT to the pack's process group (what Ctrl-C in a terminal sends) once both workers
    have written shards: exit 130, one line on stderr, no process of it left; run again, the
    pack resumes and every file is in the dataset once."""
    files = make_files(tmp_path / "src", 3000)
    dest = tmp_path / "out"
    command = [SHARDSTREAM, "pack", str(tmp_path / "src"), str(dest), "--workers", "2"]
    command += ["--max-samples-per-shard", "1", "--no-progress"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as in a terminal: a shell's background job (CI started with `&`) ignores SIGINT, and its
        # children would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    journal = dest / ".shardstream"
    try:
        deadline = time.monotonic() + 60
        while not all(any(journal.glob(f"s{stream:05d}-*.json")) for stream in (0, 1)):  # each worker's first shard
            assert process.poll() is None, f"the pack ended before both workers wrote a shard: {process.stderr.read()}"
            assert time.monotonic() < deadline, "no shard from both workers within 60 s"
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            reap_killed_semaphores.before_killpg(process.pid)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, err
    assert err == (
        "shardstream: interrupted; run the same command again to resume: the shards published so far are kept\n"
    )
    assert out == ""
    deadline = time.monotonic() + 30
    while True:  # the workers exit too, each in its own time
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a worker of the interrupted pack still runs 30 s later"
        time.sleep(0.05)
    assert not (dest / "index.bin").exists()
    done_before = len(list(dest.glob("*.tar")))
    assert 0 < done_before < len(files)

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "(resumed)" in again.stdout and (dest / "index.bin").exists()
    packed = members(dest)
    assert len(packed) == len(files) and set(packed) == files


@pytest.mark.parametrize(
    ("task_ids", "array"),
    [
        (("0", "1"), {}),  # the task ID is the part
        (("0", "1"), {"min": "0", "max": "1", "step": "1"}),  # --array=0-1
        (("1", "2"), {"min": "1", "max": "2", "step": "1"}),  # --array=1-2: counted from the first task
        (("4", "7"), {"min": "4", "max": "7", "step": "3"}),  # --array=4-7:3
    ],
    ids=["ids", "array=0-1", "array=1-2", "array=4-7:3"],
)
def test_two_slurm_array_tasks_pack_their_parts_and_together_every_file_once(tmp_path, task_ids, array):
    """The two tasks of a 2-task array, one after the other: each packs a part of its own (the
    first leaves the index to the last part), together every file exactly once, the same bytes as
    one pack of everything (docs/packing.md)."""
    files = make_files(tmp_path / "src", 24, per_dir=8)
    options = ["--workers", "1", "--max-samples-per-shard", "2", "--no-progress"]
    whole = tmp_path / "whole"
    assert run("pack", str(tmp_path / "src"), str(whole), *options).returncode == 0
    shards = {p.name for p in whole.glob("*.tar")}
    assert len(shards) == 12

    dest = tmp_path / "array"
    first = run("pack", str(tmp_path / "src"), str(dest), *options, env=slurm_env(task_ids[0], "2", **array))
    assert first.returncode == 0, first.stderr
    assert first.stdout.rstrip().endswith("; other parts unfinished, index not written yet")
    part0 = {p.name for p in dest.glob("*.tar")}
    assert 0 < len(part0) < len(shards) and not (dest / "index.bin").exists()
    assert first.stdout.startswith(f"packed {2 * len(part0)} files ")

    second = run("pack", str(tmp_path / "src"), str(dest), *options, env=slurm_env(task_ids[1], "2", **array))
    assert second.returncode == 0, second.stderr
    assert f"index {dest / 'index.bin'}: 12 shards, 24 samples" in second.stdout
    part1 = {p.name for p in dest.glob("*.tar")} - part0
    assert second.stdout.startswith(f"packed {2 * len(part1)} files ")
    assert part0 | part1 == shards
    in0, in1 = members(dest, part0), members(dest, part1)
    assert not set(in0) & set(in1) and sorted(in0 + in1) == sorted(files)
    for name in shards:
        assert (dest / name).read_bytes() == (whole / name).read_bytes(), name
    assert (dest / "index.bin").read_bytes() == (whole / "index.bin").read_bytes()


@pytest.mark.parametrize(
    ("task_id", "count", "array", "line"),
    [
        (
            "2",
            "2",
            {},
            "shardstream: error: SLURM_ARRAY_TASK_ID='2' / SLURM_ARRAY_TASK_COUNT='2': the part is the task ID, "
            "so the array's tasks must be numbered 0 to 1 (#SBATCH --array=0-1), or give --part I/N",
        ),
        (
            "0",
            "2",
            {"min": "1", "max": "2"},
            "shardstream: error: SLURM_ARRAY_TASK_ID='0' / SLURM_ARRAY_TASK_COUNT='2': task 0 is not one of the "
            "array 1-2",
        ),
        (
            "2",
            "2",
            {"min": "0", "max": "2"},
            "shardstream: error: SLURM_ARRAY_TASK_ID='2' / SLURM_ARRAY_TASK_COUNT='2': the array 0-2 does not "
            "hold 2 evenly spaced tasks (an array with gaps, such as --array=0,2,5, has no part numbering): give "
            "each task --part I/N",
        ),
        (
            "a",
            "2",
            {},
            "shardstream: error: SLURM_ARRAY_TASK_ID='a' / SLURM_ARRAY_TASK_COUNT='2' must be integers with "
            "0 <= index < count",
        ),
    ],
)
def test_a_bad_slurm_array_task_is_a_usage_error_naming_the_variables(tmp_path, task_id, count, array, line):
    make_files(tmp_path / "src", 3)
    result = run(
        "pack", str(tmp_path / "src"), str(tmp_path / "out"), "--no-progress", env=slurm_env(task_id, count, **array)
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [line] and result.stdout == ""
    assert not list((tmp_path / "out").glob("*.tar"))
