"""pack at scale: workers, parts, resume after SIGKILL, file lists, S3 sources, shuffle,
the bad-input report, verify."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import all_files

from shardstream import Part, ShardDataset, open_index, pack
from shardstream.errors import DestinationError
from shardstream.storage import open_store

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))


def dataset_files(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}


def read_back(dest, **kwargs) -> dict[str, bytes]:
    got = {}
    for sample in ShardDataset(dest, shuffle=False, **kwargs):
        for ext, payload in sample.items():
            if not ext.startswith("__"):
                name = sample["__key__"] + (f".{ext}" if ext else "")
                assert name not in got, f"{name} twice"
                got[name] = payload
    return got


def make_tree(root: Path, *, classes: int = 6, per_class: int = 40, size: int = 300) -> Path:
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (root / f"class{c}" / f"{i:04d}.bin").write_bytes(os.urandom(size))
            (root / f"class{c}" / f"{i:04d}.cls").write_bytes(str(c).encode())
    return root


def test_workers_are_deterministic_and_parts_give_the_same_dataset(tmp_path):
    src = make_tree(tmp_path / "src")
    one = pack(src, tmp_path / "w2a", workers=2, max_samples_per_shard=7, progress=False)
    pack(src, tmp_path / "w2b", workers=2, max_samples_per_shard=7, progress=False)
    assert dataset_files(tmp_path / "w2a") == dataset_files(tmp_path / "w2b")
    assert one.num_shards == open_index(tmp_path / "w2a").num_shards
    assert read_back(tmp_path / "w2a") == all_files(src)

    first = pack(src, tmp_path / "parts", workers=1, part=Part(0, 2), max_samples_per_shard=7, progress=False)
    assert first.index_url is None and not (tmp_path / "parts" / "index.bin").exists()
    with pytest.raises(DestinationError, match=r"parts \[1\] of 2 have not finished"):
        subprocess_merge(tmp_path / "parts", check=True)
    second = pack(src, tmp_path / "parts", workers=1, part=Part(1, 2), max_samples_per_shard=7, progress=False)
    assert second.index_url is not None  # the last part to finish writes the index
    assert dataset_files(tmp_path / "parts") == dataset_files(tmp_path / "w2a")


def subprocess_merge(dest: Path, *, check: bool) -> None:
    from shardstream.packing.journal import SPEC_NAME, PackSpec
    from shardstream.packing.merge import merge

    store = open_store(dest)
    merge(store, PackSpec.from_json(store.read_bytes(SPEC_NAME), url="spec"))


@pytest.mark.slow
def test_index_merge_command_and_torchrun_parts(tmp_path):
    src = make_tree(tmp_path / "src")
    pack(src, tmp_path / "ref", workers=2, max_samples_per_shard=7, progress=False)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    for i in (0, 1):
        run = subprocess.run(
            [
                SHARDSTREAM,
                "pack",
                str(src),
                str(tmp_path / "cli"),
                "--workers",
                "1",
                "--part",
                f"{i}/2",
                "--max-samples-per-shard",
                "7",
                "--no-progress",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
    (tmp_path / "cli" / "index.bin").unlink()
    merged = subprocess.run([SHARDSTREAM, "index", "merge", str(tmp_path / "cli")], capture_output=True, text=True)
    assert merged.returncode == 0 and "wrote" in merged.stdout
    assert dataset_files(tmp_path / "cli") == dataset_files(tmp_path / "ref")

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            "--master-port=0",
            "-m",
            "shardstream.cli",
            "pack",
            str(src),
            str(tmp_path / "torchrun"),
            "--workers",
            "1",
            "--max-samples-per-shard",
            "7",
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert dataset_files(tmp_path / "torchrun") == dataset_files(tmp_path / "ref")


@pytest.mark.slow
def test_sigkill_at_several_points_then_the_same_command_finishes_the_job(tmp_path, reap_killed_semaphores):
    src = make_tree(tmp_path / "src", classes=10, per_class=150, size=2000)
    dest = tmp_path / "out"
    command = [
        SHARDSTREAM,
        "pack",
        str(src),
        str(dest),
        "--workers",
        "2",
        "--max-samples-per-shard",
        "2",
        "--no-progress",
    ]
    total_shards = 10 * 150 // 2
    for threshold in (5, 120, 300):  # the last leaves ~450 shards to go: the kill lands well before the end
        process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while len(list(dest.glob("*.tar"))) < threshold and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        try:
            reap_killed_semaphores.before_killpg(process.pid)
            os.killpg(process.pid, signal.SIGKILL)  # the pack and its workers, at once
        except ProcessLookupError:
            pass
        process.wait()
        assert not (dest / "index.bin").exists() or process.returncode == 0
    before = len(list(dest.glob("*.tar")))
    assert 0 < before < total_shards
    final = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "(resumed)" in final.stdout
    written_now = int(final.stdout.split(" into ")[1].split(" shards")[0])
    assert written_now <= total_shards - before + 2 * 2  # at most the shards in progress again
    names = list(open_index(dest).manifest.names())
    assert sorted(p.name for p in dest.glob("*.tar")) == sorted(names)  # no orphans
    assert sorted(p.name for p in dest.glob("*.samples")) == sorted(n + ".samples" for n in names)
    assert not list(dest.glob(".*.partial-*")) and not list((dest / ".shardstream").glob(".*.partial-*"))
    assert read_back(dest) == all_files(src)  # every sample exactly once, byte for byte
    clean = tmp_path / "clean"
    pack(src, clean, workers=2, max_samples_per_shard=2, progress=False)
    assert dataset_files(clean) == dataset_files(dest)  # the same bytes as a pack never killed


def test_files_from_newline_nul_and_stdin(tmp_path):
    src = make_tree(tmp_path / "src", classes=2, per_class=5)
    names = [f"class1/{i:04d}.{e}" for i in (3, 1) for e in ("bin", "cls")] + ["class0/0000.bin"]
    (tmp_path / "list.txt").write_text("\n".join(names) + "\n")
    (tmp_path / "list0").write_bytes(b"\0".join(n.encode() for n in names))
    expected = {n: (src / n).read_bytes() for n in names}
    a = pack(src, tmp_path / "a", files_from=tmp_path / "list.txt", progress=False)
    b = pack(src, tmp_path / "b", files_from=tmp_path / "list0", progress=False)
    assert read_back(tmp_path / "a") == read_back(tmp_path / "b") == expected
    keys = [x["__key__"] for x in ShardDataset(tmp_path / "a", shuffle=False)]
    assert keys == ["class1/0003", "class1/0001", "class0/0000"]  # the list's order
    assert a.num_files == b.num_files == 5
    run = subprocess.run(
        [
            SHARDSTREAM,
            "pack",
            str(src),
            str(tmp_path / "c"),
            "--files-from",
            "-",
            "--no-progress",
            "--on-error",
            "skip",
        ],
        input="\n".join(names + ["class0/missing.bin", "../outside.bin"]),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert read_back(tmp_path / "c") == expected
    report = [json.loads(line) for line in (tmp_path / "c" / "pack-report.jsonl").read_text().splitlines()]
    assert {(r["kind"], Path(r["path"]).name) for r in report} == {
        ("vanished", "missing.bin"),
        ("bad_name", "outside.bin"),
    }


def test_pack_from_an_s3_prefix_equals_packing_the_directory(tmp_path, stdlib_tree, s3_bucket, s3_config):
    src = stdlib_tree / "email"
    store = open_store(f"s3://{s3_bucket}/raw", s3=s3_config)
    for name in all_files(src):
        store.write_bytes(name, (src / name).read_bytes())
    pack(f"s3://{s3_bucket}/raw", tmp_path / "from-s3", s3=s3_config, max_shard_bytes=64 << 10, progress=False)
    pack(src, tmp_path / "from-disk", max_shard_bytes=64 << 10, progress=False)
    from_s3, from_disk = dataset_files(tmp_path / "from-s3"), dataset_files(tmp_path / "from-disk")
    assert from_s3.pop("pack-report.jsonl").count(b"\n") == from_disk.pop("pack-report.jsonl").count(b"\n") == 1
    assert from_s3 == from_disk  # the same shards and index: S3 is listed in the walk's order


def test_pack_time_shuffle_spreads_classes_over_shards(tmp_path):
    src = make_tree(tmp_path / "src", classes=10, per_class=30, size=10)
    pack(src, tmp_path / "plain", max_samples_per_shard=30, progress=False)
    pack(src, tmp_path / "mixed", max_samples_per_shard=30, shuffle=True, seed=3, progress=False)
    pack(src, tmp_path / "again", max_samples_per_shard=30, shuffle=True, seed=3, progress=False)
    pack(src, tmp_path / "other", max_samples_per_shard=30, shuffle=True, seed=4, progress=False)

    def classes_per_shard(dest):
        index = open_index(dest)
        return [len({key.split("/")[0] for key in index.table(i).keys()}) for i in range(index.num_shards)]

    assert classes_per_shard(tmp_path / "plain") == [1] * 10
    assert min(classes_per_shard(tmp_path / "mixed")) >= 5
    assert dataset_files(tmp_path / "mixed") == dataset_files(tmp_path / "again")
    assert dataset_files(tmp_path / "mixed") != dataset_files(tmp_path / "other")
    assert read_back(tmp_path / "mixed") == all_files(src)


def test_every_bad_input_is_reported_with_skip_and_stops_the_pack_with_fail(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("good")
    (src / "empty.txt").write_bytes(b"")
    (src / "broken.txt").symlink_to(src / "nowhere")
    os.mkfifo(src / "pipe")
    (src / "grows.txt").symlink_to("/proc/self/stat")  # lists as 0 bytes, reads as more
    with open(os.fsencode(src) + b"/latin\xe9.txt", "wb") as f:
        f.write(b"x")
    (src / "line\nbreak.txt").write_text("x")
    (src / "photo.JPG").write_text("upper")
    (src / "photo.jpg").write_text("lower")
    result = subprocess.run(
        [SHARDSTREAM, "pack", str(src), str(tmp_path / "out"), "--no-progress"], capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stderr.count("shardstream: error:") == 1
    result = subprocess.run(
        [SHARDSTREAM, "pack", str(src), str(tmp_path / "out"), "--no-progress", "--on-error", "skip"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    report = [json.loads(line) for line in (tmp_path / "out" / "pack-report.jsonl").read_text().splitlines()]
    kinds = sorted((Path(r["path"]).name, r["kind"]) for r in report)
    assert kinds == sorted(
        [
            ("broken.txt", "unreadable"),
            ("pipe", "not_regular"),
            ("empty.txt", "empty"),
            ("grows.txt", "changed"),
            ("latin\udce9.txt", "bad_name"),
            ("line\nbreak.txt", "bad_name"),
            ("photo.jpg", "collision"),
        ]
    )
    assert "; 6 skipped, 1 warning" in result.stdout
    assert read_back(tmp_path / "out") == {"good.txt": b"good", "empty.txt": b"", "photo.JPG": b"upper"}


def test_verify_and_info(tmp_path, stdlib_tree):
    dest = tmp_path / "ds"
    pack(stdlib_tree / "email", dest, max_shard_bytes=32 << 10, progress=False)
    ok = subprocess.run([SHARDSTREAM, "verify", str(dest), "--no-progress"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("shards match the index")
    info = subprocess.run([SHARDSTREAM, "info", str(dest)], capture_output=True, text=True)
    assert info.returncode == 0 and "samples per shard: min" in info.stdout
    shards = sorted(dest.glob("*.tar"))
    flipped = bytearray(shards[1].read_bytes())
    flipped[-2000] ^= 1  # inside a payload: only the checksum can tell
    shards[1].write_bytes(bytes(flipped))
    shards[2].write_bytes(shards[2].read_bytes()[:1024])
    shards[3].unlink()
    bad = subprocess.run([SHARDSTREAM, "verify", str(dest), "--no-progress"], capture_output=True, text=True)
    assert bad.returncode == 1
    lines = [line for line in bad.stdout.splitlines() if line.startswith("BAD ")]
    assert any(shards[1].name in line and "CRC-32" in line for line in lines)
    assert any(shards[2].name in line for line in lines)
    assert any(shards[3].name in line and "no such shard" in line for line in lines)
    assert bad.stdout.strip().endswith(f"{len(shards) - 3} of {len(shards)} shards match the index; 3 do not")


def test_a_pack_to_s3_killed_mid_upload_resumes_and_leaves_no_unfinished_upload(
    tmp_path, s3_server, s3_bucket, s3_config, reap_killed_semaphores
):
    src = make_tree(tmp_path / "src", classes=4, per_class=60, size=120_000)  # ~29 MB
    url = f"s3://{s3_bucket}/killed"
    env = {**os.environ, **s3_server.info.env()}
    command = [SHARDSTREAM, "pack", str(src), url, "--workers", "2", "--shard-size", "6MiB", "--no-progress"]
    store = open_store(url, s3=s3_config)
    process = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not [n for n in store.list_names(".shardstream/s") if "done" not in n] and time.monotonic() < deadline:
        time.sleep(0.02)  # until the first shard is published and recorded
    try:
        reap_killed_semaphores.before_killpg(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    assert not store.exists("index.bin")
    final = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "(resumed)" in final.stdout
    assert read_back(url, s3=s3_config) == all_files(src)
    from shardstream.storage import loop as io_loop

    uploads = io_loop.run(store.call("list_multipart_uploads", url=url, Bucket=s3_bucket, Prefix="killed/"))
    assert not uploads.get("Uploads"), uploads.get("Uploads")
    names = list(open_index(url, s3=s3_config).manifest.names())
    assert sorted(n for n in store.list_names() if n.endswith(".tar")) == sorted(names)


def test_parts_with_other_options_and_a_changed_input_are_refused(tmp_path):
    src = make_tree(tmp_path / "src", classes=2, per_class=10)
    pack(src, tmp_path / "parts", workers=1, part=Part(0, 2), progress=False)
    with pytest.raises(
        DestinationError, match=r"unfinished pack made with other options \(workers: 1 recorded, 2 given\)"
    ):
        pack(src, tmp_path / "parts", workers=2, part=Part(1, 2), progress=False)

    names = [f"class{c}/{i:04d}.bin" for c in range(2) for i in range(10)]
    listed = tmp_path / "list.txt"
    (src / "class1" / "bad.bin").symlink_to("/proc/self/mem")  # listed fine, fails when read
    listed.write_text("\n".join(names[:15] + ["class1/bad.bin"] + names[15:]))
    dest = tmp_path / "listed"
    with pytest.raises(Exception, match="bad.bin"):
        pack(src, dest, files_from=listed, max_samples_per_shard=2, progress=False)
    assert list(dest.glob("*.tar"))  # shards before the bad entry stay, for the resume
    listed.write_text("\n".join(reversed(names)))
    with pytest.raises(DestinationError, match=r"the --files-from list changed since this pack listed it"):
        pack(src, dest, files_from=listed, max_samples_per_shard=2, progress=False)


def test_destination_inside_source_through_a_symlink_or_an_s3_prefix(tmp_path, s3_bucket, s3_config):
    src = make_tree(tmp_path / "src", classes=1, per_class=2)
    (tmp_path / "link").symlink_to(src)
    with pytest.raises(DestinationError, match="is inside SOURCE"):
        pack(src, tmp_path / "link" / "out", progress=False)
    with pytest.raises(DestinationError, match=rf"s3://{s3_bucket}/raw/out is inside SOURCE s3://{s3_bucket}/raw"):
        pack(f"s3://{s3_bucket}/raw/", f"s3://{s3_bucket}/raw/out", s3=s3_config, progress=False)


def test_a_damaged_record_is_named_with_the_way_out(tmp_path):
    src = make_tree(tmp_path / "src", classes=2, per_class=10)
    dest = tmp_path / "out"
    pack(src, dest, workers=1, max_samples_per_shard=3, progress=False)
    (dest / ".shardstream" / "s00000-done.json").write_bytes(b"")  # the merge reads a stream's rows from it
    merged = subprocess.run([SHARDSTREAM, "index", "merge", str(dest)], capture_output=True, text=True)
    assert merged.returncode == 1
    assert "s00000-done.json: damaged pack record" in merged.stderr and "--overwrite" in merged.stderr
