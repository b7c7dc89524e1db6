"""shardstream.dali on the CPU (device_id=None): the same pipeline the GPU runs with
device="mixed", checked for shapes, dtypes, value ranges, exact epochs and errors.

DALI comes with the test extra (nvidia-dali-cuda120); SHARDSTREAM_NO_DALI=1 skips these
tests on a machine that cannot install it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from shardstream import ShardDataset, pack
from shardstream.collate import ByteCollate
from shardstream.errors import DecodeError
from shardstream.testing.synth import make_image_dataset

if os.environ.get("SHARDSTREAM_NO_DALI") == "1":
    pytest.skip("SHARDSTREAM_NO_DALI=1: DALI tests skipped on request", allow_module_level=True)

from shardstream.dali import IMAGENET_MEAN, IMAGENET_STD, DaliLoader, gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU that torch and DALI can use here")
pytestmark = pytest.mark.slow  # DALI pipelines

NUM_IMAGES = 45


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory) -> Path:
    """45 JPEGs (64-160 px) with .cls labels and an .id member holding each sample's number."""
    root = tmp_path_factory.mktemp("dali")
    make_image_dataset(root / "src", num_images=NUM_IMAGES, num_classes=5, min_side_px=64, max_side_px=160)
    for jpg in sorted((root / "src").rglob("*.jpg")):
        jpg.with_suffix(".id").write_text(str(int(jpg.stem)))
    pack(root / "src", root / "ds", max_samples_per_shard=7, progress=False)
    return root / "ds"


def test_cpu_pipeline_float_batches_of_the_documented_shape(images_dir):
    loader = DaliLoader(ShardDataset(images_dir, shuffle_buffer=10), batch_size=8, crop_px=32, device_id=None)
    assert loader.device == torch.device("cpu") and len(loader) == 6  # 45 = 5 x 8 + 5
    batches = list(loader)
    assert [len(labels) for _, labels in batches] == [8, 8, 8, 8, 8, 5]
    images = torch.cat([x for x, _ in batches])
    labels = torch.cat([y for _, y in batches])
    assert images.shape == (NUM_IMAGES, 3, 32, 32) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and sorted(labels.tolist()) == sorted(i % 5 for i in range(NUM_IMAGES))
    low = min(-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    high = max((1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    assert low - 1e-4 <= images.min() and images.max() <= high + 1e-4
    assert images.std() > 0.1  # real pixels, not a constant


def test_every_sample_once_per_epoch_and_epochs_restart(images_dir):
    loader = DaliLoader(
        ShardDataset(images_dir, shuffle_buffer=10),
        batch_size=4,
        crop_px=16,
        label_ext="id",
        dtype=torch.uint8,
        device_id=None,
        num_workers=2,
    )
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader) == 12
        images = torch.cat([x for x, _ in batches])
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16) and images.max() > 100
        epochs.append(torch.cat([y for _, y in batches]).tolist())
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(NUM_IMAGES))
    assert epochs[0] != epochs[1]  # reshuffled


def _cpu_loader(dataset: ShardDataset, batch_size: int, **options) -> DaliLoader:
    """A DaliLoader on the CPU with 16-px crops and the .id member as label."""
    return DaliLoader(dataset, batch_size=batch_size, crop_px=16, label_ext="id", device_id=None, **options)


def _reading_workers() -> set[int]:
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.timeout(180)
def test_reading_workers_persist_across_epochs_and_close_stops_them(images_dir):
    before = _reading_workers()
    loader = _cpu_loader(ShardDataset(images_dir, shuffle_buffer=10, batch_size=4), 4, num_workers=2)
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        if epoch == 1:  # an epoch left after 2 batches: the next one is still whole and exact
            for i, _ in enumerate(loader):
                if i == 1:
                    break
            continue
        ids = torch.cat([y for _, y in loader]).tolist()
        assert sorted(ids) == list(range(NUM_IMAGES))
        seen.append(_reading_workers() - before)
    assert len(seen[0]) == 2 and seen[0] == seen[1]  # the same two processes, forked once
    loader.close()
    assert not (_reading_workers() & seen[0])
    loader.set_epoch(3)
    assert sorted(torch.cat([y for _, y in loader]).tolist()) == list(range(NUM_IMAGES))  # new workers
    loader.close()


@pytest.mark.timeout(180)
def test_an_epoch_that_raises_retires_its_persistent_workers(tmp_path):
    src = tmp_path / "src"
    make_image_dataset(src, num_images=12, num_classes=3, min_side_px=32, max_side_px=48)
    next(iter(sorted(src.rglob("*.cls")))).write_text("dog")
    pack(src, tmp_path / "ds", progress=False)
    before = _reading_workers()
    loader = DaliLoader(
        ShardDataset(tmp_path / "ds", batch_size=4), batch_size=4, crop_px=16, device_id=None, num_workers=2
    )
    with pytest.raises(DecodeError, match="not an integer"):
        list(loader)
    failed = _reading_workers() - before
    assert len(failed) == 2
    with pytest.raises(DecodeError, match="not an integer"):  # new workers: the failed ones are stopped first
        list(loader)
    again = _reading_workers() - before
    assert len(again) == 2 and not again & failed
    loader.close()  # stops the second epoch's, which failed too
    assert not _reading_workers() - before
    assert loader.stats()["images"] == 0


@pytest.mark.timeout(180)
def test_a_second_epoch_while_one_runs_is_refused_and_the_next_one_is_whole(images_dir):
    loader = _cpu_loader(ShardDataset(images_dir, batch_size=5), 5, num_workers=2)
    first = iter(loader)
    next(first)
    with pytest.raises(RuntimeError, match="still being iterated"):
        next(iter(loader))
    del first  # left early: its workers are reset for the next epoch
    assert sorted(torch.cat([y for _, y in loader]).tolist()) == list(range(NUM_IMAGES))
    loader.close()


@pytest.mark.timeout(180)
def test_persistent_workers_exit_cleanly_at_interpreter_exit_and_remove_their_slots(images_dir, tmp_path):
    import subprocess

    script = tmp_path / "run.py"
    script.write_text(
        "import multiprocessing, sys\n"
        "from shardstream import ShardDataset\n"
        "from shardstream.dali import DaliLoader\n"
        f"loader = DaliLoader(ShardDataset({str(images_dir)!r}, batch_size=5), batch_size=5, crop_px=16,\n"
        "                    label_ext='id', device_id=None, num_workers=2)\n"
        "assert sum(len(y) for _, y in loader) == 45\n"
        "print(' '.join(str(p.pid) for p in multiprocessing.active_children()), flush=True)\n"
    )  # ends with the loader open: no close()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    pids = done.stdout.split()
    assert len(pids) == 2
    left = [p.name for p in Path("/dev/shm").glob("shardstream-batch-*") if p.name.split("-")[2] in pids]
    assert not left, left


@pytest.mark.timeout(180)
def test_persistent_workers_false_forks_each_epoch(images_dir):
    before = _reading_workers()
    loader = _cpu_loader(ShardDataset(images_dir, batch_size=5), 5, num_workers=2, persistent_workers=False)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sorted(torch.cat([y for _, y in loader]).tolist()) == list(range(NUM_IMAGES))
        assert not _reading_workers() - before  # the epoch's workers have exited


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_with_exactly_the_samples_not_yet_yielded(images_dir, num_workers):
    from resume_check import Checkpoints, check_resume  # here: the module's imports are another change's

    def loader_of(dataset):
        return DaliLoader(dataset, batch_size=4, crop_px=16, label_ext="id", device_id=None, num_workers=num_workers)

    def resumed(dataset, state):
        dataset.load_state_dict(state)
        return loader_of(dataset)

    how = Checkpoints(
        open=loader_of,
        save=lambda loader, dataset, taken: loader.state_dict(),
        resume=resumed,
        ids=lambda batch: batch[1].tolist(),  # the labels: each sample's number (.id)
    )
    # stop after 3 batches, with more read ahead by the workers and the feed
    run = check_resume(
        lambda: ShardDataset(images_dir, shuffle_buffer=10), how, stop_after=3, expected=range(NUM_IMAGES)
    )
    assert len(run.taken) == 12 and len(run.rest) == NUM_IMAGES - 12


def test_ranks_get_equal_batch_counts(images_dir, monkeypatch):
    seen, counts = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        dataset = ShardDataset(images_dir, drop_last=True)  # 22 per rank: no sample repeated to fill up
        loader = DaliLoader(dataset, batch_size=5, crop_px=16, label_ext="id", device_id=None, last_batch="drop")
        batches = list(loader)
        counts.append((len(loader), len(batches)))
        seen += torch.cat([y for _, y in batches]).tolist()
    assert counts == [(4, 4), (4, 4)]  # 22 samples per rank, batches of 5, the short one dropped
    assert len(seen) == len(set(seen)) == 40


@pytest.mark.gpu
@needs_gpu
def test_gpu_pipeline_gives_cuda_batches_and_every_sample_once(images_dir):
    """The mixed (nvJPEG) path: batches on cuda:0, documented shapes, dtypes and ranges, exact epochs."""
    low = min(-m / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    high = max((1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    for dtype in (torch.float32, torch.uint8):
        loader = DaliLoader(
            ShardDataset(images_dir, shuffle_buffer=10),
            batch_size=8,
            crop_px=32,
            label_ext="id",
            dtype=dtype,
            device_id="auto",
        )
        assert loader.device == torch.device("cuda", 0)
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = list(loader)
            assert [len(y) for _, y in batches] == [8, 8, 8, 8, 8, 5]
            images = torch.cat([x for x, _ in batches])
            labels = torch.cat([y for _, y in batches])
            assert images.device == labels.device == torch.device("cuda", 0)
            assert images.shape == (NUM_IMAGES, 3, 32, 32) and images.dtype == dtype and labels.dtype == torch.int64
            if dtype == torch.uint8:
                assert images.max() > 100
            else:
                assert low - 1e-4 <= images.min() and images.max() <= high + 1e-4 and images.std() > 0.1
            epochs.append(labels.tolist())
        assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(NUM_IMAGES)) and epochs[0] != epochs[1]


def test_bad_members_are_named(images_dir, tmp_path):
    with pytest.raises(DecodeError, match=r"has no 'png' member"):
        list(DaliLoader(ShardDataset(images_dir), batch_size=4, image_ext="png", device_id=None))
    with pytest.raises(ValueError, match="decode=None"):
        DaliLoader(ShardDataset(images_dir, decode="torch"), batch_size=4, device_id=None)
    with pytest.raises(ValueError, match="without collate="):
        DaliLoader(ShardDataset(images_dir, batch_size=4, collate=ByteCollate()), batch_size=4, device_id=None)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(np.zeros(10, np.uint8).tobytes())
    (src / "a.cls").write_text("cat")
    pack(src, tmp_path / "ds", progress=False)
    with pytest.raises(DecodeError, match=r"'a' member 'cls' is not an integer label"):
        list(DaliLoader(ShardDataset(tmp_path / "ds"), batch_size=4, device_id=None))


def test_a_missing_dali_names_the_extra(monkeypatch):
    import shardstream.dali as module

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(ImportError, match=r"pip install 'shardstream\[dali\]'"):
        module._import_dali()


def test_a_mixture_feeds_dali_with_exact_counts_per_source(images_dir, tmp_path):
    """Two image datasets, one read whole and one 1.5 times (ids 1000+): DALI decodes the
    mixture; each epoch holds each source's count exactly."""
    from shardstream import Source

    make_image_dataset(tmp_path / "src", num_images=20, num_classes=5, min_side_px=64, max_side_px=96)
    for jpg in sorted((tmp_path / "src").rglob("*.jpg")):
        jpg.with_suffix(".id").write_text(str(1000 + int(jpg.stem)))
    pack(tmp_path / "src", tmp_path / "more", max_samples_per_shard=6, progress=False)
    dataset = ShardDataset(
        [Source(images_dir, name="base"), Source(tmp_path / "more", repeat=1.5, name="more")],
        shuffle_buffer=10,
        batch_size=5,
    )
    loader = DaliLoader(dataset, batch_size=5, crop_px=16, label_ext="id", device_id=None, num_workers=2)
    assert len(loader) == (NUM_IMAGES + 30) // 5
    ids = torch.cat([y for _, y in loader]).tolist()
    assert sorted(i for i in ids if i < 1000) == list(range(NUM_IMAGES))
    more = [i for i in ids if i >= 1000]
    assert len(more) == 30 and len(set(more)) == 20  # all 20 once, 10 of them twice


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stalled_store_is_an_error_within_batch_timeout_s_not_a_hang(images_dir, s3_config, s3_bucket, num_workers):
    """Every shard GET of an S3 dataset waits 30 s at a proxy (below the read timeout, so no
    retry ends it): the loader raises within its 3 s batch_timeout_s, with the feed thread
    reading or with DataLoader workers, instead of waiting on the store."""
    import dataclasses
    import time

    from servers.faultproxy import FaultProxy

    url = f"s3://{s3_bucket}/dali-stall-{num_workers}"
    pack(images_dir, url, s3=s3_config, from_shards=True, progress=False)
    shard_gets = lambda method, path: method == "GET" and path.endswith(".tar")  # noqa: E731
    with FaultProxy(s3_config.endpoint_url, rates={"delay": 1.0}, match=shard_gets, delay_s=30.0) as proxy:
        s3 = dataclasses.replace(s3_config, endpoint_url=proxy.endpoint_url)
        dataset = ShardDataset(url, s3=s3, shuffle=False)
        loader = DaliLoader(
            dataset,
            batch_size=5,
            crop_px=16,
            label_ext="id",
            device_id=None,
            num_workers=num_workers,
            batch_timeout_s=3,
        )
        started = time.monotonic()
        with pytest.raises((TimeoutError, RuntimeError), match=r"timed out after 3 seconds|batch_timeout_s"):
            next(iter(loader))
        assert time.monotonic() - started < 20


def test_batch_timeout_s_must_be_positive(images_dir):
    with pytest.raises(ValueError, match="batch_timeout_s"):
        DaliLoader(ShardDataset(images_dir), batch_size=5, device_id=None, batch_timeout_s=0)
