"""An unfinished pack is never taken for a finished one (issue 51, point 1): a pack stopped by a
bad file, Ctrl-C or SIGKILL, then ``info``, ``ls``, ``verify``, ``ShardDataset`` and ``index
build`` on its destination, then the same pack again; on local disk and on S3."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_pack_scale import dataset_files, make_tree, read_back

from shardstream import ShardDataset, UnfinishedPackError, open_index, pack
from shardstream.index import Manifest, write_with_keys
from shardstream.storage import open_store
from shardstream.testing import make_image_dataset

SHARDSTREAM = str(Path(sys.executable).parent / "shardstream")
SHARD_BYTES = 60_000


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHARDSTREAM, *args], capture_output=True, text=True, env=env, timeout=timeout)


def image_tree(root: Path) -> Path:
    """Three class folders of photo-like JPEGs; the last file of the walk, ``zz.jpg`` in the last
    class folder, is cut short, so ``--check-images`` stops the pack after most shards are published."""
    make_image_dataset(root, num_images=36, num_classes=3, min_side_px=64, max_side_px=200, cls_files=False)
    (last_class(root) / "zz.jpg").write_bytes(sorted(last_class(root).iterdir())[-1].read_bytes()[:300])
    return root


def last_class(root: Path) -> Path:
    return sorted(root.iterdir())[-1]


def fix(src: Path) -> None:
    """The bad file replaced by a good image of another size."""
    shutil.copy(sorted(last_class(src).iterdir())[0], last_class(src) / "zz.jpg")


def unfinished_line(dest: str, source: Path, published: str) -> str:
    return (
        f"{dest} holds an unfinished pack of {source} ({published} published): run the same pack command again "
        "to finish it"
    )


def planned_shards(dest: str | Path, s3=None) -> int:
    """The shards a listed pack will write, as its listing records them."""
    return json.loads(open_store(dest, s3=s3).read_bytes(".shardstream/list-done.json"))["num_shards"]


def bad_file_sequence(src: Path, dest: str, *, env: dict[str, str] | None, s3=None) -> None:
    """The sequence a user went through: a pack that stops at a bad file, then every command on
    its destination, then the fix and the same pack, which finishes it."""
    command = ["pack", str(src), dest, "--labels-from-dirs", "--check-images", "--workers", "1"]
    command += ["--shard-size", str(SHARD_BYTES), "--no-progress"]
    first = cli(*command, env=env)
    assert first.returncode == 1 and "zz.jpg': does not decode as an image" in first.stderr, first.stderr
    store = open_store(dest, s3=s3)
    published = sum(1 for n in store.list_names() if n.endswith(".tar"))
    planned = planned_shards(dest, s3=s3)
    assert 0 < published < planned
    line = unfinished_line(store.url, src, f"{published} of {planned} shards")

    # every reader says what is there, in one line, and reads nothing
    for args in (("info", dest), ("ls", dest), ("verify", dest), ("head", dest)):
        done = cli(*args, env=env)
        assert done.returncode == 1 and done.stdout == "", (args, done.stdout, done.stderr)
        assert done.stderr == f"shardstream: error: {line} (it has no index yet, so it is not a dataset)\n", args
    with pytest.raises(UnfinishedPackError, match=re.escape(line)):
        ShardDataset(dest, s3=s3)

    # index build refuses it, naming --partial; nothing is written
    built = cli("index", "build", dest, "--no-progress", env=env)
    assert built.returncode == 1, built.stderr
    assert built.stderr.startswith(f"shardstream: error: {line}; an index of its shards now would be taken")
    assert "--partial" in built.stderr and not store.exists("index.bin")

    # --partial indexes it, and says so everywhere
    assert cli("index", "build", dest, "--partial", "--no-progress", env=env).returncode == 0
    note = f"a partial index: it indexes an unfinished pack of {src} ({published} of {planned} shards published)"
    info = cli("info", dest, env=env)
    assert info.returncode == 0 and info.stdout.splitlines()[0].startswith(f"warning: {store.url}: {note}")
    verified = cli("verify", dest, "--no-progress", env=env)
    assert verified.returncode == 1 and f"the dataset is not whole: {store.url}: {note}" in verified.stdout
    ls = cli("ls", dest, env=env)
    assert ls.returncode == 0 and note in ls.stderr

    # the same pack never says "nothing to do" over it: it stops at the same file again
    again = cli(*command, env=env)
    assert again.returncode == 1 and "nothing to do" not in again.stdout + again.stderr
    assert "zz.jpg': does not decode as an image" in again.stderr

    # fixed (a good image of another size), the same command finishes the pack and writes its own index
    fix(src)
    finished = cli(*command, env=env)
    assert finished.returncode == 0, finished.stderr
    assert "(resumed)" in finished.stdout and "changed size since the pack listed SOURCE" in finished.stderr
    index = open_index(dest, s3=s3)
    assert index.num_samples == 37 and index.manifest.partial is None
    assert index.manifest.classes == sorted(p.name for p in src.iterdir())
    assert index.manifest.class_counts == [12, 12, 13]
    assert cli("verify", dest, "--no-progress", env=env).returncode == 0
    assert not cli("info", dest, env=env).stdout.startswith("warning")
    done = cli(*command, env=env)
    assert done.returncode == 0 and done.stdout.startswith(f"nothing to do: {store.url} already holds this pack")


def test_a_pack_stopped_by_a_bad_file_is_named_until_the_same_command_finishes_it(tmp_path):
    bad_file_sequence(image_tree(tmp_path / "src"), str(tmp_path / "out"), env=None)


def test_the_same_on_s3(tmp_path, s3_server, s3_bucket, s3_config):
    env = {**os.environ, **s3_server.info.env()}
    bad_file_sequence(image_tree(tmp_path / "src"), f"s3://{s3_bucket}/out", env=env, s3=s3_config)


@pytest.mark.slow  # two packs of ~1,000 shards with 2 spawned workers each, killed and resumed
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_a_pack_stopped_by_a_signal_is_named_then_finished_byte_identical(tmp_path, stop, reap_killed_semaphores):
    src = make_tree(tmp_path / "src", classes=6, per_class=150, size=500)
    dest = tmp_path / "out"
    command = [SHARDSTREAM, "pack", str(src), str(dest), "--workers", "2", "--max-samples-per-shard", "1"]
    command.append("--no-progress")
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(dest.glob("*.tar"))) < 50 and process.poll() is None:
            assert time.monotonic() < deadline, "no 50 shards within 120 s"
            time.sleep(0.01)
        if stop == signal.SIGKILL:
            reap_killed_semaphores.before_killpg(process.pid)
        os.killpg(process.pid, stop)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            reap_killed_semaphores.before_killpg(process.pid)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if stop == signal.SIGINT:
        assert process.returncode == 130 and "run the same command again to resume" in err
    assert not (dest / "index.bin").exists()
    info = cli("info", str(dest))
    assert info.returncode == 1
    assert re.fullmatch(
        rf"shardstream: error: {re.escape(str(dest))} holds an unfinished pack of {re.escape(str(src))} "
        r"\(\d+ of 900 shards published\): run the same pack command again to finish it \(it has no index yet, "
        r"so it is not a dataset\)\n",
        info.stderr,
    ), info.stderr
    assert cli("index", "build", str(dest), "--no-progress").returncode == 1 and not (dest / "index.bin").exists()
    final = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0 and "(resumed)" in final.stdout, final.stderr
    clean = tmp_path / "clean"
    pack(src, clean, workers=2, max_samples_per_shard=1, progress=False)
    assert dataset_files(clean) == dataset_files(dest)  # the same bytes as a pack never stopped


def test_an_index_an_older_shardstream_built_over_an_unfinished_pack_is_named_and_replaced(tmp_path, caplog):
    """Before this check, ``index build`` indexed an unfinished pack without a word: such an index
    (no partial note) is named by ``info`` and ``verify`` from the pack state beside it, and the
    same pack goes on and writes its own."""
    src = image_tree(tmp_path / "src")
    dest = tmp_path / "out"
    options = dict(labels_from_dirs=True, check_images=True, max_shard_bytes=SHARD_BYTES, progress=False)
    with pytest.raises(ValueError, match="does not decode"):
        pack(src, dest, **options)
    assert cli("index", "build", str(dest), "--partial", "--no-progress").returncode == 0
    with caplog.at_level(logging.WARNING, logger="shardstream"):  # a reader of a partial index says so
        assert len(list(ShardDataset(dest, shuffle=False))) == open_index(dest).num_samples
    assert f"{dest}/index.bin: a partial index, read as it is: it indexes an unfinished pack of {src}" in caplog.text
    caplog.clear()
    old = Manifest.parse((dest / "index.bin").read_bytes(), url="index.bin")
    old.partial = None  # what an older index build wrote
    write_with_keys(open_store(dest), old)
    info = cli("info", str(dest))
    assert info.returncode == 0
    assert info.stdout.splitlines()[0] == (
        f"warning: {unfinished_line(str(dest), src, f'{old.num_shards} of {planned_shards(dest)} shards')}; the "
        "index there covers only part of it"
    )
    assert cli("verify", str(dest), "--no-progress").returncode == 1
    fix(src)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        report = pack(src, dest, **options)
    assert "indexes an unfinished pack" in caplog.text
    assert report.resumed and not report.already_complete and report.dataset_totals["num_samples"] == 37
    assert pack(src, dest, **options).already_complete


def test_nothing_to_do_only_when_the_index_is_the_packs_own(tmp_path, caplog):
    src = make_tree(tmp_path / "src", classes=2, per_class=20)
    dest = tmp_path / "out"
    pack(src, dest, max_samples_per_shard=5, progress=False)
    before = dataset_files(dest)
    assert pack(src, dest, max_samples_per_shard=5, progress=False).already_complete
    # an index rebuilt over the same shards describes the same dataset: still the pack's
    assert cli("index", "build", str(dest), "--overwrite", "--no-progress").returncode == 0
    assert pack(src, dest, max_samples_per_shard=5, progress=False).already_complete
    # one that lists fewer shards is not: the pack writes its own again, from its records
    manifest = open_index(dest).manifest
    fewer = Manifest.from_columns(
        names=list(manifest.names())[:-1],
        shard_bytes=manifest.shard_bytes[:-1],
        shard_samples=manifest.shard_samples[:-1],
        shard_members=manifest.shard_members[:-1],
        crc32=manifest.crc32[:-1],
    )
    write_with_keys(open_store(dest), fewer)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        report = pack(src, dest, max_samples_per_shard=5, progress=False)
    assert "is not the index this pack's records make (8 shards, 40 samples)" in caplog.text
    assert not report.already_complete and report.dataset_totals["num_shards"] == 8
    assert dataset_files(dest) == before and read_back(dest) == {
        f"{p.parent.name}/{p.name}": p.read_bytes() for p in src.rglob("*") if p.is_file()
    }


def test_index_merge_refuses_an_index_it_did_not_write(tmp_path):
    src = make_tree(tmp_path / "src", classes=2, per_class=10)
    dest = tmp_path / "out"
    pack(src, dest, max_samples_per_shard=5, progress=False)
    assert cli("index", "merge", str(dest)).returncode == 0  # its own: written again
    manifest = open_index(dest).manifest
    write_with_keys(
        open_store(dest),
        Manifest.from_columns(
            names=list(manifest.names())[:1],
            shard_bytes=manifest.shard_bytes[:1],
            shard_samples=manifest.shard_samples[:1],
            shard_members=manifest.shard_members[:1],
            crc32=manifest.crc32[:1],
        ),
    )
    refused = cli("index", "merge", str(dest))
    assert refused.returncode == 1 and "is not the index the pack recorded there wrote" in refused.stderr
    assert "--overwrite" in refused.stderr and open_index(dest).num_shards == 1
    assert cli("index", "merge", str(dest), "--overwrite").returncode == 0 and open_index(dest).num_shards == 4
