"""`shardstream index build`: other tools' shards (GNU tar, tarfile, webdataset's TarWriter)
indexed in place, then read with exact epochs, byte ranges and verify, sample for sample as
webdataset reads them; links left out; compressed shards and an index already there refused."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

from shardstream import ShardDataset, open_index
from shardstream.errors import CorruptShardError
from shardstream.packing.build import build_index
from shardstream.packing.verify import verify

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))


def webdataset_samples(urls: list[str]) -> list[dict]:
    return [
        {k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    ]


def strip(samples) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "__shard__"} for s in samples]


@pytest.fixture
def foreign(tmp_path) -> Path:
    """Three shards by three writers in one directory, one with a symbolic link."""
    out = tmp_path / "shards"
    out.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"a{i:02d}.jpg").write_bytes(os.urandom(500 + 37 * i))
        (src / f"a{i:02d}.cls").write_text(str(i % 3))
    os.symlink("a00.jpg", src / "zz.jpg")
    subprocess.run(["tar", "--sort=name", "-cf", str(out / "part-0.tar"), "-C", str(src), "."], check=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(6):
            for ext, payload in (("png", os.urandom(1500 + i)), ("json", b'{"i": %d}' % i)):
                info = tarfile.TarInfo(f"b/{i:02d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    (out / "part-1.tar").write_bytes(buf.getvalue())
    with wds.TarWriter(str(out / "part-2.tar")) as sink:
        for i in range(7):
            sink.write({"__key__": f"c{i:02d}", "txt": f"text {i}", "cls": i})
    return out


def test_index_build_then_read_as_webdataset_reads_with_exact_epochs(foreign, monkeypatch):
    result = subprocess.run(
        [SHARDSTREAM, "index", "build", str(foreign), "--workers", "2", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "3 shards, 21 samples" in result.stdout
    urls = [str(foreign / f"part-{i}.tar") for i in range(3)]
    reference = webdataset_samples(urls)
    dataset = ShardDataset(foreign, shuffle=False)
    assert len(dataset) == 21 and open_index(foreign).manifest.foreign
    assert strip(dataset) == reference  # the link is left out, as webdataset leaves it
    halves = []
    for rank in range(2):  # byte ranges cut inside shards, from the new tables
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        halves.append(strip(ShardDataset(foreign, shuffle=False)))
    assert len(halves[0]) == len(halves[1]) == 11  # ceil(21 / 2): one repeated to keep ranks equal
    assert {s["__key__"] for s in halves[0] + halves[1]} == {s["__key__"] for s in reference}
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    shuffled = strip(ShardDataset(foreign, shuffle=True, seed=3))
    assert sorted(s["__key__"] for s in shuffled) == sorted(s["__key__"] for s in reference)
    assert all(check.ok for check in verify(str(foreign)))
    assert {p.name for p in foreign.iterdir()} == {
        "index.bin",
        "keys",
        *(f"part-{i}.tar{x}" for i in range(3) for x in ("", ".samples")),
    }


def test_an_indexed_foreign_shard_read_whole_from_s3(foreign, s3_bucket, s3_config):
    """From S3 a whole shard is parsed, not sliced: its link is skipped there too."""
    from shardstream.storage import open_store

    store = open_store(f"s3://{s3_bucket}/foreign", s3=s3_config)
    for path in foreign.iterdir():
        store.write_bytes(path.name, path.read_bytes())
    manifest = build_index([f"s3://{s3_bucket}/foreign"], s3=s3_config, workers=1)
    assert manifest.num_samples == 21
    got = strip(ShardDataset(f"s3://{s3_bucket}/foreign", s3=s3_config, shuffle=False))
    assert got == webdataset_samples([str(foreign / f"part-{i}.tar") for i in range(3)])


def test_what_index_build_refuses(foreign, tmp_path):
    build_index([str(foreign)], workers=1)
    again = subprocess.run(
        [SHARDSTREAM, "index", "build", str(foreign / "part-0.tar"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 1 and "an index is already there; pass --overwrite" in again.stderr
    assert build_index([str(foreign / "part-1.tar")], workers=1, overwrite=True).num_shards == 1
    zipped = tmp_path / "zipped"
    zipped.mkdir()
    subprocess.run(["gzip", "-k", str(foreign / "part-1.tar")], check=True)
    os.replace(foreign / "part-1.tar.gz", zipped / "part-1.tar.gz")
    with pytest.raises(CorruptShardError, match=r"part-1.tar.gz: a compressed shard; an index addresses"):
        build_index([str(zipped)], workers=1)
    two_places = subprocess.run(
        [SHARDSTREAM, "index", "build", str(foreign / "part-0.tar"), str(zipped / "part-1.tar.gz"), "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert two_places.returncode == 2 and "the shards lie in 2 places" in two_places.stderr


def test_pack_from_shards_reshards_foreign_and_compressed_shards(foreign, tmp_path):
    """Resharding: every sample of other tools' shards (one of them gzip-compressed) packed
    again, same keys and bytes, into shards of 4 samples by 2 workers, streamed through."""
    subprocess.run(["gzip", str(foreign / "part-1.tar")], check=True)  # part-1.tar.gz now
    inputs = [str(foreign / n) for n in ("part-0.tar", "part-1.tar.gz", "part-2.tar")]
    reference = sorted(webdataset_samples(inputs), key=lambda s: s["__key__"])
    out = tmp_path / "resharded"
    result = subprocess.run(
        [
            SHARDSTREAM,
            "pack",
            str(foreign),
            str(out),
            "--from-shards",
            "--max-samples-per-shard",
            "4",
            "--workers",
            "2",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    dataset = ShardDataset(out, shuffle=False)
    assert len(dataset) == 21 and dataset.num_shards == 6  # stream 0: inputs 0 and 2 (15 samples, 4 shards); 1: 6, 2
    assert sorted(strip(dataset), key=lambda s: s["__key__"]) == reference
    assert all(check.ok for check in verify(str(out)))
    again = subprocess.run(
        [
            SHARDSTREAM,
            "pack",
            str(foreign),
            str(out),
            "--from-shards",
            "--max-samples-per-shard",
            "4",
            "--workers",
            "2",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "already" in again.stdout.lower() + again.stderr.lower()
    shuffled = tmp_path / "shuffled"
    from shardstream import pack

    pack(str(foreign / "part-{0,2}.tar"), shuffled, from_shards=True, shuffle=True, seed=1, progress=False)
    keys = [s["__key__"] for s in ShardDataset(shuffled, shuffle=False)]
    assert sorted(keys) == sorted(s["__key__"] for s in webdataset_samples([inputs[0], inputs[2]]))
    assert keys != sorted(keys)


def test_index_build_output_elsewhere_leaves_read_only_shards_untouched(foreign, tmp_path):
    before = {p.name: p.read_bytes() for p in foreign.iterdir()}
    foreign.chmod(0o555)  # shards nobody may write beside (a public bucket's, say)
    try:
        result = subprocess.run(
            [
                SHARDSTREAM,
                "index",
                "build",
                str(foreign),
                "--output",
                str(tmp_path / "idx"),
                "--workers",
                "1",
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert {p.name: p.read_bytes() for p in foreign.iterdir()} == before
        assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == [
            "index.bin",
            "keys",
            "part-0.tar.samples",
            "part-1.tar.samples",
            "part-2.tar.samples",
        ]
        dataset = ShardDataset(tmp_path / "idx", shuffle=False)
        assert strip(dataset) == webdataset_samples([str(foreign / f"part-{i}.tar") for i in range(3)])
        assert all(check.ok for check in verify(str(tmp_path / "idx")))
        assert dataset.index.shard_url(0) == str(foreign / "part-0.tar")
    finally:
        foreign.chmod(0o755)


@pytest.mark.slow
def test_a_reshard_killed_midway_resumes_to_the_same_bytes(tmp_path):
    """SIGKILL a 2-worker `pack --from-shards` once it has published some shards; the same
    command finishes the job (resumed), and the result is byte for byte a reshard never killed."""
    import signal
    import time

    from shardstream import pack

    src = tmp_path / "src"
    for i in range(1200):
        (src / f"d{i // 100}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i // 100}" / f"{i:05d}.bin").write_bytes(os.urandom(1500))
    pack(src, tmp_path / "in", max_samples_per_shard=100, progress=False)  # 12 input shards
    dest = tmp_path / "out"
    command = [
        SHARDSTREAM,
        "pack",
        str(tmp_path / "in"),
        str(dest),
        "--from-shards",
        "--workers",
        "2",
        "--max-samples-per-shard",
        "2",
        "--no-progress",
    ]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list(dest.glob("*.tar"))) < 60 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    before = len(list(dest.glob("*.tar")))
    assert 0 < before < 600 and not (dest / "index.bin").exists()
    final = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "(resumed)" in final.stdout
    clean = tmp_path / "clean"
    pack(tmp_path / "in", clean, from_shards=True, workers=2, max_samples_per_shard=2, progress=False)
    files = {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}
    assert files == {p.name: p.read_bytes() for p in clean.iterdir() if p.is_file()}
    assert ShardDataset(dest).num_samples == 1200


def test_resampled_reads_of_an_indexed_foreign_dataset_skip_its_links(foreign):
    """resampled=True reads whole shards by parsing them, as bare shard URLs are read: the
    link that index build left out must be skipped there too, not refused as in packed shards."""
    build_index([str(foreign)], workers=1)
    keys = {s["__key__"] for s in ShardDataset(foreign, shuffle=False)}
    dataset = ShardDataset(foreign, resampled=True, seed=1, shuffle=False)
    drawn = [s["__key__"] for s in itertools.islice(iter(dataset), 200)]
    assert len(drawn) == 200 and set(drawn) <= keys
    assert len(set(drawn)) > len(keys) // 2  # shards drawn at random, with replacement
