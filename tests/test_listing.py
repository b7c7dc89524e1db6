"""The source is listed once per pack: shards that do not depend on the number of parts or
workers, one LIST per directory page whatever the number of streams, and one lister among
parts started together."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import all_files
from servers.faultproxy import FaultProxy
from test_pack_scale import dataset_files, make_tree, read_back

from shardstream import Part, S3Config, pack
from shardstream.format import split_key
from shardstream.packing.journal import SPEC_NAME, PackSpec
from shardstream.packing.listing import LISTING_DONE, LISTING_LOCK, Listing, ensure_listing
from shardstream.storage import open_store


def nested_tree(root: Path) -> Path:
    """Files at the top, in classes, and two levels down, with a sample of two members."""
    make_tree(root, classes=3, per_class=25, size=700)
    for sub in ("deep/a", "deep/b", "deep/b/c"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            (root / sub / f"x{i}.bin").write_bytes(os.urandom(300 + 97 * i))
    (root / "top.txt").write_bytes(b"top")
    return root


def pack_with(src: Path, dest: Path, *, parts: int = 1, workers: int = 1, **options) -> None:
    for index in range(parts):
        pack(src, dest, part=Part(index, parts), workers=workers, progress=False, **options)


@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_are_byte_identical_whatever_the_parts_and_workers(tmp_path, shuffle):
    src = nested_tree(tmp_path / "src")
    options = {"max_shard_bytes": 12_000, "shuffle": shuffle, "seed": 3, "shuffle_buffer": 40}
    pack_with(src, tmp_path / "one", **options)
    reference = dataset_files(tmp_path / "one")
    assert sum(name.endswith(".tar") for name in reference) > 8  # several shards per stream below
    for parts, workers in ((1, 3), (2, 2), (3, 1)):
        dest = tmp_path / f"p{parts}w{workers}"
        pack_with(src, dest, parts=parts, workers=workers, **options)
        assert dataset_files(dest) == reference, (parts, workers)  # shards, tables, index.bin, report
    assert read_back(tmp_path / "one") == all_files(src)


def test_a_listed_pack_matches_the_writers_rotation(tmp_path):
    """Planned shards end where the writer would end them: the same shards as the writer's
    own rotation, which ShardWriter uses (tests/test_write.py compares it with pack too)."""
    from shardstream import ShardWriter

    src = nested_tree(tmp_path / "src")
    pack(src, tmp_path / "packed", max_shard_bytes=9_000, max_samples_per_shard=5, progress=False)
    spec = PackSpec.from_json(open_store(tmp_path / "packed").read_bytes(SPEC_NAME), url="spec")
    store = open_store(tmp_path / "packed")
    listing = Listing.load(store, spec.digest)
    with ShardWriter(tmp_path / "written", max_shard_bytes=9_000, max_samples_per_shard=5) as writer:
        for _, sample in listing.iter_shards(store, str(src), 0, listing.num_shards):
            members = {split_key(f.member_name)[1]: Path(f.path).read_bytes() for f in sample.files}
            writer.write({"__key__": sample.key, **members})
    packed, written = dataset_files(tmp_path / "packed"), dataset_files(tmp_path / "written")
    shards = sorted(n for n in packed if n.endswith(".tar"))
    assert shards == sorted(n for n in written if n.endswith(".tar"))
    assert all(packed[n] == written[n] for n in shards)


def test_a_listing_in_many_files_packs_the_same_shards(tmp_path, monkeypatch):
    """A listing past LIST_FILE_ENTRIES files is cut into listing files of whole shards; each
    file's entry in list-done.json counts its shards and files, and the streams (spawned
    workers, reading only the files of their shards) write what a one-file listing gives."""
    import shardstream.packing.listing as listing_module

    src = nested_tree(tmp_path / "src")
    options = {"max_shard_bytes": 6_000}
    pack_with(src, tmp_path / "one", **options)
    monkeypatch.setattr(listing_module, "LIST_FILE_ENTRIES", 7)
    pack_with(src, tmp_path / "many", workers=2, **options)
    store = open_store(tmp_path / "many")
    spec = PackSpec.from_json(store.read_bytes(SPEC_NAME), url="spec")
    listing = Listing.load(store, spec.digest)
    assert len(listing.files) > 5
    first = 0
    for number, (start, count, files) in enumerate(listing.files):
        assert start == first and count > 0
        first += count
        lines = store.read_bytes(listing_module.list_file_name(number)).split(b"\n")[1:]
        entries = sum(line.count(b"\0") // 2 + 1 for line in lines)  # member\0size\0member\0size
        assert files == entries
        assert entries >= 7 or number == len(listing.files) - 1  # cut at the first shard boundary past 7
    assert first == listing.num_shards
    assert sum(files for _, _, files in listing.files) == listing.num_files == len(all_files(src))
    assert dataset_files(tmp_path / "many") == dataset_files(tmp_path / "one")


def upload_tree(src: Path, url: str, s3: S3Config) -> None:
    store = open_store(url, s3=s3)
    for path in sorted(src.rglob("*")):
        if path.is_file():
            store.write_bytes(path.relative_to(src).as_posix(), path.read_bytes())


def test_an_s3_source_is_listed_once_whatever_the_streams(tmp_path, s3_server, s3_bucket, s3_config):
    src = nested_tree(tmp_path / "src")
    upload_tree(src, f"s3://{s3_bucket}/src", s3_config)
    lists: list[str] = []

    def count(method: str, path: str) -> bool:
        if method == "GET" and path.rstrip("/") == f"/{s3_bucket}":  # a bucket GET is a LIST
            lists.append(path)
        return False

    with FaultProxy(s3_server.info.endpoint_url, rates={}, match=count) as proxy:
        via = S3Config(**{**s3_config.__dict__, "endpoint_url": proxy.endpoint_url})
        listed = {}
        for parts, workers in ((1, 1), (2, 2)):
            lists.clear()
            dest = f"s3://{s3_bucket}/out-{parts}-{workers}"
            for index in range(parts):
                pack(
                    f"s3://{s3_bucket}/src",
                    dest,
                    part=Part(index, parts),
                    workers=workers,
                    max_shard_bytes=12_000,
                    s3=via,
                    progress=False,
                )
            listed[(parts, workers)] = len(lists)
    directories = 1 + 3 + 4  # src, class0-2, deep, deep/a, deep/b, deep/b/c (one page each)
    # the listing (one LIST per directory) plus the few LISTs of state and partials per stream
    assert listed[(1, 1)] >= directories
    # 4 streams add only their own state's LISTs: not one more walk of the source (4 walks before)
    assert listed[(2, 2)] - listed[(1, 1)] < directories
    for parts, workers in listed:
        got = read_back(f"s3://{s3_bucket}/out-{parts}-{workers}", s3=s3_config)
        assert got == all_files(src)


def test_a_part_waits_for_the_lister_and_takes_over_a_dead_one(tmp_path):
    src = nested_tree(tmp_path / "src")
    dest = tmp_path / "out"

    def part(index: int) -> None:
        pack(src, dest, part=Part(index, 2), max_shard_bytes=12_000, progress=False)

    # a lister on this machine that died (its pid is gone) is taken over at once
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (dest / ".shardstream").mkdir(parents=True)
    claimed = PackSpec(  # what the dead lister's part recorded before it listed
        source=str(src.resolve()),
        files_from=False,
        name="data",
        max_shard_bytes=12_000,
        max_samples_per_shard=None,
        num_parts=2,
        workers=1,
        shuffle=False,
        seed=0,
        listed=True,
    )
    (dest / SPEC_NAME).write_bytes(claimed.to_json())
    lock = {"host": socket.gethostname(), "pid": int(dead.stdout), "time": time.time()}
    (dest / LISTING_LOCK).write_text(json.dumps(lock))
    started = time.monotonic()
    part(0)
    assert time.monotonic() - started < 30
    assert not (dest / LISTING_LOCK).exists() and (dest / LISTING_DONE).exists()
    part(1)
    assert read_back(dest) == all_files(src)

    # a live lister elsewhere is waited for, then taken over once its lock stops moving
    store = open_store(tmp_path / "other")
    spec = PackSpec.from_json(open_store(dest).read_bytes(SPEC_NAME), url="spec")
    store.write_bytes(LISTING_LOCK, json.dumps({"host": "elsewhere", "pid": 1, "time": time.time()}).encode())
    result = {}

    def wait_and_list() -> None:
        result["listing"] = ensure_listing(
            store,
            spec,
            list_path=None,
            on_problem=lambda p: None,
            shuffle_samples=1,
            wait_poll_s=0.05,
            stale_lock_s=1.5,
        )

    waiter = threading.Thread(target=wait_and_list)
    started = time.monotonic()
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and not store.exists(LISTING_DONE)  # waiting while the lock is fresh
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert time.monotonic() - started >= 1.5
    assert result["listing"] == Listing.load(open_store(dest), spec.digest)  # the same listing, made here


def test_a_planned_shard_whose_files_all_vanished_is_recorded_empty(tmp_path):
    src = make_tree(tmp_path / "src", classes=1, per_class=12, size=500)
    (src / "class0" / "0005.bin").unlink()
    (src / "class0" / "0005.bin").symlink_to("/proc/self/mem")  # listed fine, fails when read: the pack stops
    dest = tmp_path / "out"
    with pytest.raises(Exception, match=r"0005\.bin"):
        pack(src, dest, max_samples_per_shard=2, progress=False)  # shards 0, 1 written; 2 holds 0004, 0005
    assert (dest / "data-000001.tar").exists() and not (dest / "data-000002.tar").exists()
    for name in ("0006", "0007"):  # every file of planned shard 3 vanishes before it is read
        for ext in ("bin", "cls"):
            (src / "class0" / f"{name}.{ext}").unlink()
    report = pack(src, dest, max_samples_per_shard=2, on_error="skip", progress=False)
    assert report.dataset_totals is not None and report.dataset_totals["num_shards"] == 5  # of 6 planned
    assert not (dest / "data-000003.tar").exists() and (dest / "data-000005.tar").exists()
    kinds = {
        json.loads(line)["path"].rsplit("/", 1)[-1]: json.loads(line)["kind"]
        for line in open(dest / "pack-report.jsonl")
    }
    assert kinds == {
        "0005.bin": "unreadable",
        "0006.bin": "vanished",
        "0006.cls": "vanished",
        "0007.bin": "vanished",
        "0007.cls": "vanished",
    }
    got = read_back(dest)
    assert "class0/0005.bin" not in got and got == all_files(src)  # all_files skips the symlink too


def _tree_lister(fanout: int, depth: int, *, wait_s: float, seen: list[int], running: list[int], lock: threading.Lock):
    """A lister of a made-up tree (``fanout`` folders a level, ``depth`` levels) that waits
    ``wait_s`` per folder outside the GIL (as a network file system's scan does) and records
    how many scans ran at once."""

    def list_dir(rel: str):
        with lock:
            running[0] += 1
            seen.append(running[0])
        time.sleep(wait_s)
        with lock:
            running[0] -= 1
        level = rel.count("/")
        subdirs = [f"{rel}d{i}/" for i in range(fanout)] if level < depth else []
        return [], subdirs, []

    return list_dir


@pytest.mark.parametrize("wait_s, widens", [(0.0, False), (0.02, True)])
def test_ordered_walk_lists_on_more_threads_only_where_scans_wait(wait_s: float, widens: bool) -> None:
    """A page-cached scan (no wait) is listed one folder at a time, ahead of the consumer (more
    threads only take turns at the GIL); scans that wait are listed many at once. Either way the
    walk order is the same depth-first order."""
    from shardstream.packing.sources import ordered_walk

    seen: list[int] = []
    lister = _tree_lister(4, 3, wait_s=wait_s, seen=seen, running=[0], lock=threading.Lock())
    order = [rel for rel, *_ in ordered_walk(lister, threads=4, window=16)]
    expected = [""]
    for a in range(4):
        expected.append(f"d{a}/")
        for b in range(4):
            expected.append(f"d{a}/d{b}/")
            expected += [f"d{a}/d{b}/d{c}/" for c in range(4)]
    assert order == expected
    assert (max(seen) > 1) is widens, seen


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins threads to a CPU (Linux)")
def test_ordered_walk_does_not_widen_for_a_loaded_machines_preemptions() -> None:
    """Scans that only compute, on a CPU shared with four CPU-bound processes, lose more wall
    time to the kernel's run queue than they spend on the CPU; that is no wait of their own, and
    the walk stays on one thread (it widened in CI's loaded runs when wall less CPU was read as
    waiting). The walk's threads and the burners are pinned to one CPU: the others stay free."""
    from shardstream.packing.sources import ordered_walk

    def busy(rel: str):
        wall, cpu = time.perf_counter(), time.thread_time()
        with lock:
            running[0] += 1
            seen.append(running[0])
        while time.thread_time() - cpu < 0.001:  # 1 ms of CPU a folder
            pass
        with lock:
            running[0] -= 1
        lost.append((time.perf_counter() - wall) - (time.thread_time() - cpu))
        level = rel.count("/")
        return [], [f"{rel}d{i}/" for i in range(4)] if level < 3 else [], []

    seen: list[int] = []
    lost: list[float] = []
    running, lock = [0], threading.Lock()
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    spin = f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    burners = [subprocess.Popen([sys.executable, "-S", "-c", spin]) for _ in range(4)]
    try:
        os.sched_setaffinity(0, {cpu})  # this thread, and the walk's threads it starts
        time.sleep(0.3)  # the burners are running
        order = [rel for rel, *_ in ordered_walk(busy, threads=4, window=16)]
    finally:
        os.sched_setaffinity(0, allowed)
        for burner in burners:
            burner.kill()
            burner.wait(timeout=10)
    assert len(order) == 85
    cpu_s = 0.001 * len(lost)
    assert sum(lost) > max(0.05, 2 * cpu_s), f"not loaded enough to mean anything: {sum(lost):.3f} s lost"
    assert max(seen) == 1, seen
