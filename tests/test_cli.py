"""The `shardstream` console script: exit codes, one-line errors, the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardstream.cli import parse_size

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARDSTREAM, *args], capture_output=True, text=True, env=env, timeout=timeout)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("shardstream: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("256MiB", 256 << 20),
        ("1GB", 10**9),
        ("1.5 KiB", 1536),
        ("2gib", 2 << 30),
        ("10kb", 10_000),
        ("256M", 256 * 10**6),  # one rule for every option: K, M, G, T are KB, MB, GB, TB
        ("256MB", 256 * 10**6),
        ("1.25G", 1_250_000_000),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MiB", "1 XB", "-5", "0", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="bytes like 4096, 256MiB or 1GB|more than 0"):
        parse_size(text)


def test_pack_and_info(stdlib_tree, tmp_path):
    result = run("pack", str(stdlib_tree / "json"), str(tmp_path / "out"), "--shard-size", "64KiB")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("packed ") and "files/s" in result.stdout and "MB/s" in result.stdout
    assert "packing" in result.stderr  # the tqdm bar
    info = run("info", str(tmp_path / "out"))
    assert info.returncode == 0 and ": 1 shard, 5 samples, 5 members, " in info.stdout  # singular where 1


def test_missing_source_is_one_line_and_exit_1(tmp_path):
    result = run("pack", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert result.returncode == 1
    assert error_line(result) == f"shardstream: error: {tmp_path / 'nope'}: no such directory (check SOURCE)"
    assert not (tmp_path / "out").exists()


def test_a_small_shard_size_without_a_unit_is_named(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.txt").write_text("x" * 100)
    done = run("pack", str(src), str(tmp_path / "out"), "--shard-size", "256", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "shardstream: warning: --shard-size 256 is 256 bytes (a number without a unit counts bytes): nearly every "
        "sample gets a shard of its own; for megabytes write 256MiB or 256MB\n"
    )
    for size in ("1MiB", "1M", "4096000"):  # a unit, or a number of bytes large enough to be meant
        quiet = run("pack", str(src), str(tmp_path / size), "--shard-size", size, "--no-progress")
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_bad_size_is_a_usage_error(tmp_path):
    result = run("pack", str(tmp_path), str(tmp_path / "out"), "--shard-size", "lots")
    assert result.returncode == 2 and "256MiB" in result.stderr


@pytest.mark.parametrize(
    ("dest", "options", "message"),
    [
        (None, ["--name", "a/b"], "shard name prefix 'a/b'"),
        ("s3://", [], "names no bucket"),
        ("ftp://x/y", [], "unsupported URL scheme 'ftp'"),
    ],
)
def test_values_the_library_refuses_are_usage_errors(stdlib_tree, tmp_path, dest, options, message):
    result = run("pack", str(stdlib_tree / "json"), dest or str(tmp_path / "out"), *options)
    assert result.returncode == 2 and message in error_line(result)
    assert not (tmp_path / "out").exists()


def test_a_read_only_store_as_dest_says_so(stdlib_tree, tmp_path):
    result = run("pack", str(stdlib_tree / "json"), "https://127.0.0.1:9/out")
    assert result.returncode == 1
    assert error_line(result).startswith("shardstream: error: https://127.0.0.1:9/out: HTTP URLs are read-only")


def test_unreadable_file_fails_then_skips(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.txt").write_text("ok")
    (src / "bad.bin").symlink_to("/proc/self/mem")
    result = run("pack", str(src), str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 1 and str(src / "bad.bin") in error_line(result)
    assert not (tmp_path / "out" / "index.bin").exists()
    result = run("pack", str(src), str(tmp_path / "out"), "--no-progress", "--skip-unreadable")
    assert result.returncode == 0
    assert f"not packed: {src / 'bad.bin'}: cannot read" in result.stderr
    assert "; 1 skipped," in result.stdout and (tmp_path / "out" / "pack-report.jsonl").exists()


def test_s3_errors_from_the_command_line(stdlib_tree, s3_server, s3_bucket):
    env = {**os.environ, **s3_server.info.env()}
    result = run("pack", str(stdlib_tree / "json"), "s3://missing-bucket-cli/x", env=env)
    assert result.returncode == 1
    assert "s3://missing-bucket-cli: no such bucket at http://127.0.0.1:" in error_line(result)
    env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret-0000"
    result = run("pack", str(stdlib_tree / "json"), f"s3://{s3_bucket}/x", env=env)
    line = error_line(result)
    assert result.returncode == 1 and s3_bucket in line and s3_server.info.endpoint_url in line
    assert "not-the-secret-0000" not in result.stderr + result.stdout
    result = run("info", f"s3://{s3_bucket}/nothing", env={**os.environ, **s3_server.info.env()})
    assert result.returncode == 2 and f"s3://{s3_bucket}/nothing/index.bin: no index here" in error_line(result)


@pytest.mark.slow  # `shardstream demo` starts a SeaweedFS server (in its own process: tests/lanes.py cannot see it)
def test_demo_runs_end_to_end_on_its_own_s3_server(tmp_path):
    result = run("demo", "--num-images", "300", "--workdir", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "started a local S3 server (SeaweedFS)" in out
    assert "jpg (64, 3, 224, 224) torch.uint8" in out
    # 2 workers with whole batches of 64: ceil(300 / 64) = len(loader) batches, not 3 + 3
    assert "read 300 samples in 5 batches" in out and "every sample exactly once" in out
    assert "the S3 server is stopped" in out


def test_an_s3_url_without_a_bucket_is_a_usage_error(tmp_path):
    from shardstream import ShardDataset

    for url in ("s3://", "s3:/bucket/x", "S3:bucket"):
        result = run("info", url)
        assert result.returncode == 2, result.stderr
        assert f"{url!r} names no bucket: write s3://BUCKET/PREFIX" in error_line(result)
    with pytest.raises(ValueError, match=r"'s3:/bucket/x' names no bucket"):
        ShardDataset("s3:/bucket/x")
    assert not (tmp_path / "s3:").exists() and not Path("s3:").exists()


def test_packing_an_empty_source_leaves_nothing_behind(tmp_path):
    (tmp_path / "empty").mkdir()
    for _ in range(2):  # the second run fails the same way: no unfinished pack is left to finish
        result = run("pack", str(tmp_path / "empty"), str(tmp_path / "out"), "--no-progress")
        assert result.returncode == 1
        assert "holds no file to pack" in error_line(result)
        assert not (tmp_path / "out").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("a file of the user's")
    assert run("pack", str(tmp_path / "empty"), str(tmp_path / "kept"), "--no-progress").returncode == 1
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["mine.txt"]


def test_version_and_help_text_for_every_option():
    import argparse

    from shardstream import __version__
    from shardstream.cli import build_parser

    result = run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"shardstream {__version__}"
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                assert action.help, f"shardstream {name} {action.option_strings[0]} has no help text"


def test_verify_and_info_take_the_same_dataset_arguments(stdlib_tree, tmp_path):
    dest = tmp_path / "out"
    assert run("pack", str(stdlib_tree / "json"), str(dest), "--no-progress").returncode == 0
    for dataset in (str(dest), str(dest) + "/", str(dest / "index.bin")):
        for command in (["info", dataset], ["verify", dataset, "--no-progress"]):
            result = run(*command)
            assert result.returncode == 0, (command, result.stderr)


def test_info_says_when_shard_numbers_have_gaps():
    from shardstream.cli import _info
    from shardstream.index.manifest import Manifest

    def manifest(numbers):
        n = len(numbers)
        return Manifest.from_columns(
            names=[f"data-{i:06d}.tar" for i in numbers],
            shard_bytes=[10240] * n,
            shard_samples=[1] * n,
            shard_members=[1] * n,
            crc32=[0] * n,
        )

    assert "gaps" not in _info("ds", manifest([0, 1, 2]))
    text = _info("ds", manifest([0, 1, 3, 5]))
    assert "shard numbers run from 0 to 5 with gaps" in text and "not a {a..b} brace pattern" in text
