"""Datasets written from code: ShardWriter (values, key rules, atomic shards, the index) and
pack_samples (parallel, deterministic whatever the workers, resumable after SIGKILL, parts,
on_error). Results are read back with ShardDataset and checked against tarfile, webdataset
and GNU tar, and against `pack` of the same files."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardstream import (
    DestinationError,
    Part,
    S3Config,
    SampleFnError,
    ShardDataset,
    ShardstreamError,
    ShardWriter,
    SourceError,
    open_index,
    pack,
    pack_samples,
)

sys.path.insert(0, str(Path(__file__).parent))
import write_fns

SHARDSTREAM = str(Path(sys.executable).with_name("shardstream"))
KEYS = [f"{i:05d}_{j}" for i in range(200) if i % 11 != 5 for j in range(1 + i % 4)]


def dataset_files(dest: Path) -> dict[str, bytes]:
    """Shards, tables, index and report (not the pack state, which names the writer)."""
    return {p.name: p.read_bytes() for p in dest.iterdir() if p.is_file()}


def keys_of(dest: str | Path, **kwargs) -> list[str]:
    return [s["__key__"] for s in ShardDataset(dest, shuffle=False, **kwargs)]


def records(dest: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((dest / ".shardstream").glob("s*.json"))]


# ------------------------------------------------------------------------------------ values


def test_every_kind_of_value_reads_back_as_it_was_written(tmp_path):
    array = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 3
    y, x = np.mgrid[0:40, 0:60]
    picture = Image.fromarray(np.stack([x * 4, y * 6, x + y], axis=-1).astype(np.uint8))  # smooth: JPEG keeps it
    sample = {
        "__key__": "dir/000001",
        "bin": b"\x00\x01raw",
        "arr.bin": bytearray(b"from a bytearray"),
        "view.bin": memoryview(b"from a memoryview"),
        "txt": "caption: naïve café ☕",
        "cls": 7,
        "label": np.int64(3),
        "score": 0.1,
        "np_score": np.float32(0.25),
        "json": {"a": [1, 2, {"b": None}], "s": "é"},
        "list.json": [1, "two", 3.5],
        "npy": array,
        "png": picture,
        "jpg": picture,
        "__shard__": "ignored: readers add it",
    }
    with ShardWriter(tmp_path / "ds") as writer:
        writer.write(sample)
    (raw,) = list(ShardDataset(tmp_path / "ds", shuffle=False))
    (decoded,) = list(ShardDataset(tmp_path / "ds", shuffle=False, decode="numpy"))
    assert decoded["__key__"] == "dir/000001" and raw["__shard__"].endswith("data-000000.tar")
    assert (
        raw["bin"] == b"\x00\x01raw"
        and raw["arr.bin"] == b"from a bytearray"
        and raw["view.bin"] == b"from a memoryview"
    )
    assert decoded["txt"] == sample["txt"]
    assert decoded["cls"] == 7 and decoded["label"] == 3
    assert float(raw["score"]) == 0.1 and float(raw["np_score"]) == 0.25  # floats: shortest round-trip text
    assert decoded["json"] == sample["json"] and decoded["list.json"] == [1, "two", 3.5]
    assert decoded["npy"].dtype == np.float32 and np.array_equal(decoded["npy"], array)
    assert np.array_equal(decoded["png"], np.asarray(picture))  # lossless
    assert Image.open(io.BytesIO(raw["jpg"])).format == "JPEG"
    assert np.abs(decoded["jpg"].astype(int) - np.asarray(picture)).mean() < 4  # lossy, same picture
    assert Image.open(io.BytesIO(raw["png"])).format == "PNG"
    # the members are what a reference reader finds, in sorted order
    with tarfile.open(tmp_path / "ds" / "data-000000.tar") as tar:
        names = tar.getnames()
        assert names == sorted(names) and tar.extractfile("dir/000001.txt").read() == sample["txt"].encode()


@pytest.mark.parametrize(
    ("value", "ext", "message"),
    [
        (True, "cls", "bool is ambiguous"),
        (None, "bin", "cannot write a NoneType"),
        (object(), "bin", "cannot write a object"),
        (np.zeros(3), "bin", "numpy array goes under an extension ending in 'npy'"),
        (np.array([object()]), "npy", "Python objects"),
        (Image.new("RGB", (4, 4)), "txt", "PIL image goes under an image extension"),
        ({"a": 1}, "txt", "cannot write a dict"),
        ({"a": {1, 2}}, "json", "not JSON-serialisable"),
    ],
)
def test_a_value_its_extension_cannot_hold_is_a_type_error_naming_key_and_extension(tmp_path, value, ext, message):
    with ShardWriter(tmp_path / "ds") as writer:
        with pytest.raises(TypeError, match=message) as caught:
            writer.write({"__key__": "k1", ext: value})
        assert "'k1'" in str(caught.value) and repr(ext) in str(caught.value)
        writer.write({"__key__": "k1", "bin": b"ok"})  # the writer goes on; nothing of the bad one was written
    assert keys_of(tmp_path / "ds") == ["k1"]


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"bin": b"x"}, "needs a '__key__'"),
        ({"__key__": 5, "bin": b"x"}, "must be a str"),
        ({"__key__": "", "bin": b"x"}, "is empty"),
        ({"__key__": "img.001", "bin": b"x"}, "holds a dot"),
        ({"__key__": "/abs/k", "bin": b"x"}, "relative path"),
        ({"__key__": "a/../k", "bin": b"x"}, "relative path"),
        ({"__key__": "a\nb", "bin": b"x"}, "line break"),
        ({"__key__": "bad\udcff", "bin": b"x"}, "not valid UTF-8"),
        ({"__key__": "k", "JPG": b"x", "jpg": b"y"}, "differ only in case"),
        ({"__key__": "k", "": b"x"}, "is empty"),
        ({"__key__": "k", "a/b": b"x"}, "'/'"),
        ({"__key__": "k", ".jpg": b"x"}, "dot"),
        ({"__key__": "k", "__meta__": b"x"}, "reserved"),
        ({"__key__": "k"}, "has no member"),
        ({"__key__": "k", "txt": "\udcff"}, "not valid UTF-8"),
        ({"__key__": "k", "jpg": Image.new("RGBA", (4, 4))}, "cannot save a RGBA image as JPEG"),
    ],
)
def test_key_and_extension_rules_are_pack_s_and_refusals_name_the_key(tmp_path, sample, message):
    with ShardWriter(tmp_path / "ds") as writer:
        with (
            pytest.raises(ValueError, match=message)
            if "__key__" in sample and isinstance(sample["__key__"], str)
            else pytest.raises((ValueError, TypeError), match=message)
        ):
            writer.write(sample)
        writer.write({"__key__": "fine", "bin": b"x"})
    assert keys_of(tmp_path / "ds") == ["fine"]


def test_a_key_repeating_the_one_before_is_refused_as_readers_would_join_them(tmp_path):
    with ShardWriter(tmp_path / "ds") as writer:
        writer.write({"__key__": "a", "jpg": b"1"})
        with pytest.raises(ValueError, match="repeats the key of the sample before it"):
            writer.write({"__key__": "a", "cls": 1})
        writer.write({"__key__": "b", "jpg": b"2"})
    assert keys_of(tmp_path / "ds") == ["a", "b"]


# ------------------------------------------------------------------------------ the dataset


def test_the_same_samples_as_files_give_byte_identical_shards_and_index_to_pack(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    samples = []
    for i in range(60):
        sample = {"__key__": f"{i:04d}", "jpg": write_fns.payload(i, 0), "cls": i % 5}
        samples.append(sample)
        (src / f"{i:04d}.jpg").write_bytes(sample["jpg"])
        (src / f"{i:04d}.cls").write_text(str(i % 5))
    pack(src, tmp_path / "packed", max_shard_bytes=20_000, progress=False)
    with ShardWriter(tmp_path / "written", max_shard_bytes=20_000) as writer:
        for sample in samples:
            writer.write(sample)
    packed, written = dataset_files(tmp_path / "packed"), dataset_files(tmp_path / "written")
    assert len([n for n in written if n.endswith(".tar")]) > 3
    assert written == packed


def test_reference_readers_and_the_cli_agree_with_the_written_dataset(tmp_path):
    dest = tmp_path / "ds"
    with ShardWriter(dest, max_samples_per_shard=9, name="train") as writer:
        for i in range(40):
            writer.write(write_fns.one_sample(i))
    report = writer.close()
    assert report.num_samples == 40 and report.num_shards == 5 and report.dataset_totals["num_samples"] == 40
    assert "packed 40 samples" in report.summary()
    import webdataset as wds

    shards = sorted(str(p) for p in dest.glob("train-*.tar"))
    from_wds = [(s["__key__"], s["bin"], s["cls"]) for s in wds.WebDataset(shards, shardshuffle=False)]
    expected = [(f"{i:06d}", write_fns.payload(i, 0), str(i % 7).encode()) for i in range(40)]
    assert from_wds == expected
    gnu = subprocess.run(["tar", "-tf", shards[0]], capture_output=True, text=True, check=True).stdout.split()
    assert gnu == [f"{i:06d}.{ext}" for i in range(9) for ext in ("bin", "cls")]
    idx = tmp_path / "idx"
    for command, said in (
        (["verify", str(dest)], "5 of 5 shards match"),
        (["index", "--dali", str(dest), "--out-dir", str(idx)], "wrote 5"),
    ):
        done = subprocess.run([SHARDSTREAM, *command], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and said in done.stdout, done.stdout + done.stderr
    assert len(list(idx.glob("*.idx"))) == 5


def test_a_writer_to_s3_publishes_a_dataset_others_read(s3_config: S3Config, s3_bucket, tmp_path):
    url = f"s3://{s3_bucket}/written"
    with ShardWriter(url, s3=s3_config, max_samples_per_shard=7) as writer:
        for i in range(30):
            writer.write(write_fns.one_sample(i))
    assert keys_of(url, s3=s3_config) == [f"{i:06d}" for i in range(30)]
    assert open_index(url, s3=s3_config).num_shards == 5
    cached = ShardDataset(url, s3=s3_config, shuffle=False, cache_dir=tmp_path / "cache", cache_limit_bytes=10**8)
    for _ in range(2):  # the node cache fills, then serves the second epoch
        assert [s["__key__"] for s in cached] == [f"{i:06d}" for i in range(30)]
    assert cached.stats().cache_hits == 5


def test_a_block_that_raises_publishes_no_index_and_no_half_shard_and_dest_is_then_refused(tmp_path):
    dest = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="boom"), ShardWriter(dest, max_samples_per_shard=10) as writer:
        for i in range(25):
            writer.write(write_fns.one_sample(i))
        raise RuntimeError("boom")
    assert sorted(p.name for p in dest.glob("*.tar")) == ["data-000000.tar", "data-000001.tar"]  # not the 3rd
    assert not (dest / "index.bin").exists() and not [p for p in dest.iterdir() if "partial" in p.name]
    with pytest.raises(DestinationError, match="did not close.*overwrite=True"):
        ShardWriter(dest, max_samples_per_shard=10)
    with pytest.raises(DestinationError, match=r"other options \(max_samples_per_shard: 10 recorded.*overwrite=True"):
        ShardWriter(dest)
    with ShardWriter(dest, overwrite=True) as writer:
        writer.write(write_fns.one_sample(0))
    assert keys_of(dest) == ["000000"] and sorted(p.name for p in dest.glob("*.tar")) == ["data-000000.tar"]
    with pytest.raises(DestinationError, match="already holds a dataset"):
        ShardWriter(dest)


def test_a_writer_killed_mid_shard_leaves_only_whole_published_shards(tmp_path, reap_killed_semaphores):
    dest = tmp_path / "ds"
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[2]); import write_fns; from shardstream import ShardWriter\n"
        "w = ShardWriter(sys.argv[1], max_samples_per_shard=50)\n"
        "for i in range(10**6):\n"
        "    w.write(write_fns.one_sample(i))\n"
        "    if i % 50 == 25: time.sleep(0.05)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(dest), str(Path(__file__).parent)])
    deadline = time.monotonic() + 60
    while len(list((dest / ".shardstream").glob("s*-*.json"))) < 3:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    reap_killed_semaphores.before_kill(process.pid)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    recorded = {r["shard"]["name"]: r["shard"] for r in records(dest)}
    for shard in dest.glob("data-*.tar"):  # every shard under its final name is whole and recorded
        with tarfile.open(shard) as tar:
            assert len(tar.getnames()) == 100
        assert shard.stat().st_size == recorded[shard.name]["bytes"]
    assert not (dest / "index.bin").exists()
    with pytest.raises(DestinationError, match="did not close"):
        ShardWriter(dest, max_samples_per_shard=50)


def test_several_parts_write_one_dataset_and_the_last_to_close_indexes_it(tmp_path, monkeypatch):
    dest = tmp_path / "ds"
    writers = [ShardWriter(dest, part=Part(p, 3), max_samples_per_shard=4) for p in range(3)]
    for i in range(30):
        writers[i % 3].write(write_fns.one_sample(i))
    assert writers[0].close().index_url is None and writers[2].close().index_url is None
    assert writers[1].close().dataset_totals["num_samples"] == 30
    assert sorted(keys_of(dest)) == [f"{i:06d}" for i in range(30)]
    seen = []  # exact epochs over 4 ranks: equal counts, every sample (the padding repeats some)
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "4")
        keys = keys_of(dest)
        assert len(keys) == 8
        seen += keys
    assert set(seen) == {f"{i:06d}" for i in range(30)}
    with pytest.raises(ValueError, match="overwrite=True with several parts"):
        ShardWriter(dest, part=Part(0, 3), overwrite=True)


def test_closing_an_empty_writer_leaves_nothing(tmp_path):
    writer = ShardWriter(tmp_path / "ds")
    with pytest.raises(SourceError, match="no sample was written"):
        writer.close()
    assert not [p for p in (tmp_path / "ds").rglob("*") if p.is_file()]


# ---------------------------------------------------------------------------- pack_samples


@pytest.fixture(scope="module")
def clean_pack(tmp_path_factory) -> Path:
    """samples_of over 200 inputs, one worker, 5 samples a shard: the reference."""
    dest = tmp_path_factory.mktemp("clean") / "ds"
    report = pack_samples(write_fns.samples_of, range(200), dest, max_samples_per_shard=5, progress=False)
    assert report.num_files == 200 and report.num_samples == len(KEYS) and report.problems == ()
    return dest


def test_pack_samples_reads_back_every_sample_in_input_order(clean_pack):
    assert keys_of(clean_pack) == KEYS
    assert any(r.get("within") for r in records(clean_pack))  # shard limits fell inside inputs


def test_the_shards_are_byte_identical_whatever_the_workers_and_task_size(clean_pack, tmp_path):
    dest = tmp_path / "w2"
    inputs = (i for i in range(200))  # an iterator, read lazily
    report = pack_samples(
        write_fns.generated, inputs, dest, workers=2, inputs_per_task=3, max_samples_per_shard=5, progress=False
    )
    assert report.num_samples == len(KEYS)
    assert dataset_files(dest) == dataset_files(clean_pack)


def test_killed_as_a_whole_at_several_points_a_rerun_finishes_the_same_dataset(
    clean_pack, tmp_path, reap_killed_semaphores
):
    dest = tmp_path / "ds"
    command = [sys.executable, str(Path(write_fns.__file__)), str(dest), "200", "2", "5"]
    for threshold in (3, 40):
        process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while len(list(dest.glob("*.tar"))) < threshold and process.poll() is None:
            assert time.monotonic() < deadline, "the pack never got going"
            time.sleep(0.002)
        try:
            reap_killed_semaphores.before_killpg(process.pid)
            os.killpg(process.pid, signal.SIGKILL)  # the job and its workers at once
        except ProcessLookupError:
            pass
        process.wait(30)
    assert 0 < len(list(dest.glob("*.tar"))) < 120 and not (dest / "index.bin").exists()
    report = pack_samples(write_fns.samples_of, range(200), dest, workers=1, max_samples_per_shard=5, progress=False)
    assert report.resumed and report.num_files < 200
    assert dataset_files(dest) == dataset_files(clean_pack)


def test_a_worker_killed_is_an_error_and_the_rerun_resumes(clean_pack, tmp_path, monkeypatch):
    flag = tmp_path / "flag"
    flag.touch()
    monkeypatch.setenv(write_fns.FLAG_ENV, str(flag))
    dest = tmp_path / "ds"
    options = {"max_samples_per_shard": 5, "progress": False, "workers": 2, "inputs_per_task": 4}
    with pytest.raises(ShardstreamError, match="worker died.*run the same call again"):
        pack_samples(write_fns.dies_while_flagged, range(200), dest, **options)
    assert list(dest.glob("*.tar")) and not (dest / "index.bin").exists()
    flag.unlink()
    report = pack_samples(write_fns.dies_while_flagged, range(200), dest, **options)
    assert report.resumed and report.num_files < 200
    assert dataset_files(dest) == dataset_files(clean_pack)


def test_an_input_that_fails_stops_naming_it_and_the_fixed_rerun_resumes_mid_input(clean_pack, tmp_path, monkeypatch):
    flag = tmp_path / "flag"
    flag.touch()
    monkeypatch.setenv(write_fns.FLAG_ENV, str(flag))
    dest = tmp_path / "ds"
    with pytest.raises(SampleFnError, match=r"input 37: RuntimeError: flagged input 37.*on_error='skip'"):
        pack_samples(write_fns.fails_while_flagged, range(200), dest, max_samples_per_shard=5, progress=False)
    last = records(dest)[-1]
    assert last["consumed"] < 37 and last["within"] == 1  # the rerun starts inside input 35, one sample written
    flag.unlink()
    report = pack_samples(write_fns.fails_while_flagged, range(200), dest, max_samples_per_shard=5, progress=False)
    assert report.resumed and report.num_files == 200 - last["consumed"]
    assert dataset_files(dest) == dataset_files(clean_pack)


def test_on_error_skip_reports_each_bad_input_with_its_repr_and_error(tmp_path):
    dest = tmp_path / "ds"
    report = pack_samples(write_fns.bad_values, range(10), dest, on_error="skip", progress=False)
    assert keys_of(dest) == [f"{i:06d}" for i in (0, 1, 2, 5, 7, 9)]
    lines = [json.loads(line) for line in (dest / "pack-report.jsonl").read_text().splitlines()]
    assert [line["path"] for line in lines] == ["3", "4", "6", "8"]
    assert all(line["kind"] == "fn_error" and not line["packed"] for line in lines)
    reasons = [line["reason"] for line in lines]
    assert "ValueError: no such row" in reasons[0]
    assert "cannot write a object" in reasons[1] and "'004'" in reasons[1]
    assert "holds a dot" in reasons[2] and "returned a str" in reasons[3]
    assert "4 skipped" in report.summary()


def test_parts_split_the_inputs_and_the_last_part_writes_the_index(tmp_path, monkeypatch):
    dest = tmp_path / "ds"
    first = pack_samples(
        write_fns.one_sample, range(50), dest, part=Part(1, 2), max_samples_per_shard=6, progress=False
    )
    assert first.index_url is None and first.num_files == 25
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    second = pack_samples(write_fns.one_sample, range(50), dest, max_samples_per_shard=6, progress=False)
    assert second.num_files == 25 and second.dataset_totals["num_samples"] == 50
    monkeypatch.delenv("RANK")  # read as one rank
    monkeypatch.delenv("WORLD_SIZE")
    assert sorted(keys_of(dest)) == [f"{i:06d}" for i in range(50)]
    again = pack_samples(
        write_fns.one_sample, range(50), dest, part=Part(0, 2), max_samples_per_shard=6, progress=False
    )
    assert again.already_complete and again.num_files == 0


def test_a_rerun_with_other_inputs_or_another_fn_is_refused(tmp_path, monkeypatch):
    flag = tmp_path / "flag"
    flag.touch()
    monkeypatch.setenv(write_fns.FLAG_ENV, str(flag))
    dest = tmp_path / "ds"
    with pytest.raises(SampleFnError):
        pack_samples(write_fns.fails_while_flagged, range(200), dest, max_samples_per_shard=2, progress=False)
    with pytest.raises(DestinationError, match="inputs end before input"):
        pack_samples(write_fns.fails_while_flagged, range(10), dest, max_samples_per_shard=2, progress=False)
    with pytest.raises(DestinationError, match="fails_while_flagged.*recorded.*samples_of.*given"):
        pack_samples(write_fns.samples_of, range(200), dest, max_samples_per_shard=2, progress=False)


def test_fn_must_be_picklable_for_workers(tmp_path):
    with pytest.raises(TypeError, match="cannot be pickled.*module-level function"):
        pack_samples(lambda i: {"__key__": str(i), "bin": b"x"}, range(3), tmp_path / "ds", workers=2)
    report = pack_samples(lambda i: {"__key__": f"{i:03d}", "bin": b"x"}, range(3), tmp_path / "ds", progress=False)
    assert report.num_samples == 3  # one worker: this process calls it, no pickling


def test_pack_samples_to_s3_with_workers(clean_pack, s3_config, s3_bucket, tmp_path):
    url = f"s3://{s3_bucket}/made"
    pack_samples(
        write_fns.samples_of, range(200), url, workers=2, s3=s3_config, max_samples_per_shard=5, progress=False
    )
    assert keys_of(url, s3=s3_config) == KEYS
    copy = tmp_path / "copy"
    pack(url, copy, from_shards=True, s3=s3_config, max_samples_per_shard=5, progress=False)
    local = {n: d for n, d in dataset_files(clean_pack).items() if n.endswith(".tar")}
    assert {n: d for n, d in dataset_files(copy).items() if n.endswith(".tar")} == local


def test_the_progress_bar_shows_inputs_samples_and_megabytes_per_second(tmp_path, capsys):
    def slow(i: int) -> dict:
        time.sleep(0.03)
        return write_fns.one_sample(i)

    pack_samples(slow, range(40), tmp_path / "ds", progress=True)
    err = capsys.readouterr().err
    assert "inputs/s" in err and "samples/s" in err and "MB/s" in err


def test_nothing_written_by_any_input_is_an_error_that_leaves_nothing(tmp_path):
    with pytest.raises(SourceError, match="no input gave a sample"):
        pack_samples(lambda i: None, range(5), tmp_path / "ds", progress=False)
    assert not [p for p in (tmp_path / "ds").rglob("*") if p.is_file()]
    shutil.rmtree(tmp_path / "ds", ignore_errors=True)
