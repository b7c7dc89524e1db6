"""ByteCollate / ByteBatch: batches of raw bytes equal to the default collate's, through
DataLoader workers (shared-memory slots), in process, pickled; a held batch or view is never
overwritten; slots are reused and removed; fallbacks; errors."""

from __future__ import annotations

import functools
import gc
import mmap
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardstream import ShardDataset, pack
from shardstream import collate as collate_module
from shardstream.collate import ByteBatch, ByteCollate

pytestmark = pytest.mark.timeout(120)

NUM_SAMPLES = 300
PER_SHARD = 20
SHM = Path("/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir())
PREFIX = "shardstream-batch"


def _jpg_size(i: int, rng: np.random.Generator) -> int:
    if i % 10 == 3:
        return 0
    if 120 <= i < 240 or i % 10 == 7:  # runs of large payloads: batches past the 1 MiB first slot size
        return int(rng.integers(76_000, 80_000))
    return int(rng.integers(1, 20_000))


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """300 samples in shards of 20: a ``.jpg`` of random bytes (0 to ~70 KB), a ``.cls`` ASCII
    integer label and a ``.txt``; and what each key holds."""
    root = tmp_path_factory.mktemp("collate")
    src = root / "src"
    src.mkdir()
    rng = np.random.default_rng(1234)
    expected: dict[str, dict] = {}
    for i in range(NUM_SAMPLES):
        key = f"{i:05d}"
        jpg = rng.integers(0, 256, _jpg_size(i, rng), dtype=np.uint8).tobytes()
        label = (i * 7) % 13 - 2  # negative labels too
        txt = f"sample {i}".encode() * (i % 5)  # some empty
        (src / f"{key}.jpg").write_bytes(jpg)
        (src / f"{key}.cls").write_bytes(str(label).encode())
        (src / f"{key}.txt").write_bytes(txt)
        expected[key] = {"jpg": jpg, "txt": txt, "cls": label}
    pack(src, root / "ds", max_samples_per_shard=PER_SHARD, progress=False)
    return root / "ds", expected


_all_pids: Path | None = None  # every worker of this module records its pid here


@pytest.fixture(scope="module", autouse=True)
def _reap_worker_files(tmp_path_factory):
    """Files of this module's (exited) workers that the library left in /dev/shm are removed
    at the end, so a failing run leaves nothing behind."""
    global _all_pids
    _all_pids = tmp_path_factory.mktemp("worker-pids")
    yield
    for pid in _pids(_all_pids):
        if not _alive(pid):
            for path in SHM.glob(f"{PREFIX}-{pid}-*"):
                path.unlink(missing_ok=True)


def _record_pid(folders: tuple[str, ...], worker_id: int) -> None:
    for folder in folders:
        Path(folder, str(os.getpid())).touch()


def _pids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.iterdir()}


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _files_of(pids: set[int]) -> dict[int, set[str]]:
    return {pid: {p.name for p in SHM.glob(f"{PREFIX}-{pid}-*")} for pid in pids}


def _loader(dataset_dir, batch_size=16, *, label_field="cls", collate=True, pid_dir=None, **kwargs) -> DataLoader:
    dataset = ShardDataset(dataset_dir, shuffle=False, batch_size=batch_size)
    if kwargs.get("num_workers", 0) > 0:
        kwargs.setdefault("timeout", 60)
        folders = [str(_all_pids)]
        if pid_dir is not None:
            pid_dir.mkdir(exist_ok=True)
            folders.append(str(pid_dir))
        kwargs["worker_init_fn"] = functools.partial(_record_pid, tuple(folders))
    if collate:
        kwargs["collate_fn"] = ByteCollate(label_field=label_field)
    return DataLoader(dataset, batch_size=batch_size, **kwargs)


def check_batch(batch, reference: dict, expected: dict) -> None:
    """``batch`` (a ByteBatch with label_field="cls") holds what the default collate's
    ``reference`` batch does, in every form ByteBatch offers."""
    assert isinstance(batch, ByteBatch)
    n = len(reference["__key__"])
    assert batch.num_samples == n and list(batch["__key__"]) == reference["__key__"] == batch.keys
    assert set(batch) == set(reference) - {"cls"} and len(batch) == len(set(reference)) - 1
    assert set(batch.fields) == {"jpg", "txt"} and batch.extras.keys() == {"__shard__"}
    assert batch["__shard__"] == reference["__shard__"]
    for field in batch.fields:
        members = batch[field]
        assert len(members) == n
        assert all(isinstance(v, memoryview) for v in members)
        assert [bytes(v) for v in members] == reference[field]
        assert [bytes(members[i]) for i in range(-n, 0)] == reference[field]  # negative indices
        assert [bytes(v) for v in members[2:5]] == reference[field][2:5]
        assert [bytes(v) for v in members[::-3]] == reference[field][::-3]
        with pytest.raises(IndexError):
            members[n]
        arrays = batch.arrays(field)
        assert all(a.dtype == np.uint8 and a.ndim == 1 for a in arrays)
        assert [a.tobytes() for a in arrays] == reference[field]
    assert batch.nbytes == sum(len(v) for f in batch.fields for v in reference[f])
    # data / offsets layout: member f of sample i is data[offsets[i*F+f] : offsets[i*F+f+1]]
    data, offsets, num_fields = batch.data, batch.offsets, len(batch.fields)
    assert data.dtype == torch.uint8 and data.dim() == 1 and data.numel() == batch.nbytes
    assert offsets.dtype == torch.int64 and offsets.shape == (n * num_fields + 1,)
    assert offsets[0] == 0 and offsets[-1] == batch.nbytes and bool((offsets[1:] >= offsets[:-1]).all())
    raw = data.numpy().tobytes()
    for i in range(n):
        for f, field in enumerate(batch.fields):
            a, b = int(offsets[i * num_fields + f]), int(offsets[i * num_fields + f + 1])
            assert raw[a:b] == reference[field][i]
    labels = batch.labels
    assert labels.dtype == torch.int64 and labels.shape == (n,)
    assert labels.tolist() == [int(x) for x in reference["cls"]] == [expected[k]["cls"] for k in batch.keys]
    samples = list(batch.samples())
    assert [s["__key__"] for s in samples] == reference["__key__"]
    for i, s in enumerate(samples):
        assert set(s) == {"__key__", "__shard__", *batch.fields}
        assert s["__shard__"] == reference["__shard__"][i]
        assert {f: bytes(s[f]) for f in batch.fields} == {f: reference[f][i] for f in batch.fields}
    with pytest.raises(KeyError, match=r"'png'.*__key__.*jpg.*txt.*__shard__"):
        batch["png"]
    assert "png" not in batch and "jpg" in batch


def same_bytes(batch, expected: dict) -> bool:
    return all(
        bytes(v) == expected[k][f] for f in batch.fields for k, v in zip(batch.keys, batch[f])
    ) and batch.labels.tolist() == [expected[k]["cls"] for k in batch.keys]


def test_batches_from_workers_equal_the_default_collate(dataset_dir):
    ds, expected = dataset_dir
    reference = list(_loader(ds, num_workers=2, collate=False))
    batches = list(_loader(ds, num_workers=2))
    assert len(batches) == len(reference) == -(-NUM_SAMPLES // 16)
    for batch, ref in zip(batches, reference):
        check_batch(batch, ref, expected)
    assert sorted(k for b in batches for k in b.keys) == sorted(expected)
    assert max(b.nbytes for b in batches) > 1 << 20  # a batch larger than a first slot
    assert any(len(v) == 0 for b in batches for v in b["jpg"])


@pytest.mark.slow
def test_held_batches_and_views_are_never_overwritten_and_slots_are_reused(dataset_dir, tmp_path):
    ds, expected = dataset_dir
    pid_dir = tmp_path / "pids"
    it = iter(_loader(ds, batch_size=8, num_workers=2, pid_dir=pid_dir))
    held = [next(it) for _ in range(3)]
    snapshots = [[bytes(v) for v in b["jpg"]] for b in held]
    # from dropped batches: only a memoryview, a numpy view, the data tensor
    batch = next(it)
    sizes = [len(v) for v in batch["jpg"]]
    i = sizes.index(max(sizes))
    view, view_key = batch["jpg"][i], batch.keys[i]
    del batch
    batch = next(it)
    array, array_key = batch.arrays("jpg")[-1], batch.keys[-1]
    del batch
    batch = next(it)
    data, data_bytes = batch.data, batch.data.numpy().tobytes()
    del batch
    gc.collect()
    assert len(view) > 0
    pids = _pids(pid_dir)
    assert len(pids) == 2 and os.getpid() not in pids
    rest, peak = 0, dict.fromkeys(pids, 0)
    for batch in it:
        assert same_bytes(batch, expected)
        rest += 1
        for pid, names in _files_of(pids).items():
            peak[pid] = max(peak[pid], len(names))
        del batch
        if rest % 5 == 0:
            gc.collect()
    assert rest >= 30  # many more batches than slots
    for b, snapshot in zip(held, snapshots):
        assert same_bytes(b, expected) and [bytes(v) for v in b["jpg"]] == snapshot
    assert bytes(view) == expected[view_key]["jpg"]
    assert array.tobytes() == expected[array_key]["jpg"]
    assert data.numpy().tobytes() == data_bytes
    # the held ones kept slots of their own; the rest came through a few reused ones (besides the
    # held: the batches in flight, prefetch_factor=2 a worker, and the control file)
    assert all(2 <= count <= 10 for count in peak.values()), peak
    assert sum(peak.values()) - 2 < rest // 2


def test_slots_stay_few_when_each_batch_is_dropped(dataset_dir, tmp_path):
    ds, expected = dataset_dir
    pid_dir = tmp_path / "pids"
    seen, peak, count = [], {}, 0
    for batch in _loader(ds, batch_size=8, num_workers=2, pid_dir=pid_dir):
        assert same_bytes(batch, expected)
        seen += batch.keys
        count += 1
        del batch
        if count == 3:
            pids = _pids(pid_dir)
        if count >= 3:
            for pid, names in _files_of(pids).items():
                peak[pid] = max(peak.get(pid, 0), len(names))
    assert sorted(seen) == sorted(expected) and count == -(-NUM_SAMPLES // 8)
    assert len(pids) == 2 and all(1 <= n <= 6 for n in peak.values()), peak


def test_worker_slot_files_are_removed_when_the_workers_exit(dataset_dir, tmp_path):
    ds, expected = dataset_dir
    pid_dir = tmp_path / "pids"
    loader = _loader(ds, batch_size=16, num_workers=2, pid_dir=pid_dir)
    it = iter(loader)
    batches = list(it)  # the iterator finished: its (non-persistent) workers were joined
    pids = _pids(pid_dir)
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    assert all(same_bytes(b, expected) for b in batches)  # mapped: readable though the workers exited
    assert _files_of(pids) == {pid: set() for pid in pids}


def test_persistent_workers_over_three_epochs(dataset_dir, tmp_path):
    ds, expected = dataset_dir
    pid_dir = tmp_path / "pids"
    loader = _loader(ds, num_workers=2, persistent_workers=True, pid_dir=pid_dir)
    for epoch in range(3):
        loader.dataset.set_epoch(epoch)
        keys = []
        for batch in loader:
            assert same_bytes(batch, expected)
            keys += batch.keys
        assert sorted(keys) == sorted(expected), epoch
    pids = _pids(pid_dir)
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)  # the same two workers throughout
    assert all(1 <= len(names) <= 6 for names in _files_of(pids).values())
    del loader, batch
    gc.collect()


@pytest.mark.slow
def test_spawned_workers(dataset_dir, tmp_path):
    ds, expected = dataset_dir
    pid_dir = tmp_path / "pids"
    loader = _loader(ds, batch_size=32, num_workers=2, multiprocessing_context="spawn", pid_dir=pid_dir)
    batches = list(loader)
    assert sorted(k for b in batches for k in b.keys) == sorted(expected)
    assert all(same_bytes(b, expected) for b in batches)
    assert len(_pids(pid_dir)) == 2


def test_pin_memory(dataset_dir):
    ds, expected = dataset_dir
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no accelerator is found": pinning is off
        batches = list(_loader(ds, num_workers=2, pin_memory=True))
    assert all(isinstance(b, ByteBatch) and same_bytes(b, expected) for b in batches)
    batch = batches[0]
    if torch.accelerator.is_available():
        assert all(b.data.is_pinned() for b in batches)
        pinned = batch.pin_memory()
        assert isinstance(pinned, ByteBatch) and pinned.data.is_pinned() and same_bytes(pinned, expected)
        assert torch.equal(pinned.offsets, batch.offsets)
    else:  # torch itself cannot pin without an accelerator: ByteBatch.pin_memory fails the same way
        assert not any(b.data.is_pinned() for b in batches)
        with pytest.raises(RuntimeError) as torch_error:
            torch.zeros(4, dtype=torch.uint8).pin_memory()
        with pytest.raises(RuntimeError) as ours:
            batch.pin_memory()
        assert str(ours.value) == str(torch_error.value)
        assert same_bytes(batch, expected)


def test_in_process_batches_equal_the_workers_and_no_label(dataset_dir):
    ds, expected = dataset_dir
    reference = list(_loader(ds, num_workers=0, collate=False))
    in_process = list(_loader(ds, num_workers=0))
    assert len(in_process) == len(reference)
    for batch, ref in zip(in_process, reference):
        check_batch(batch, ref, expected)

    def by_key(batches):
        return {
            k: (bytes(jpg), bytes(txt), label, shard)
            for b in batches
            for k, jpg, txt, label, shard in zip(b.keys, b["jpg"], b["txt"], b.labels.tolist(), b["__shard__"])
        }

    # the workers cut the batches elsewhere (each its own shards), with the same samples
    assert by_key(in_process) == by_key(_loader(ds, num_workers=2)) and len(by_key(in_process)) == NUM_SAMPLES
    for batch in _loader(ds, num_workers=2, label_field=None):
        assert batch.labels is None
        assert set(batch.fields) == {"jpg", "cls", "txt"} and "cls" in batch
        assert [int(bytes(v)) for v in batch["cls"]] == [expected[k]["cls"] for k in batch.keys]
        assert [bytes(v) for v in batch["jpg"]] == [expected[k]["jpg"] for k in batch.keys]
        assert batch.offsets.shape == (3 * batch.num_samples + 1,)


def test_a_worker_past_max_slots_pickles_its_batches(dataset_dir, tmp_path, monkeypatch):
    ds, expected = dataset_dir
    monkeypatch.setattr(collate_module, "MAX_SLOTS", 2)  # inherited by the forked workers
    pid_dir = tmp_path / "pids"
    held, peak = [], {}
    for batch in _loader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork", pid_dir=pid_dir):
        held.append(batch)
        for pid, names in _files_of(_pids(pid_dir)).items():
            peak[pid] = max(peak.get(pid, 0), len(names))
    # every batch held: past its 2 slots a worker sends the rest pickled, all of them right
    assert len(held) == -(-NUM_SAMPLES // 8) and sorted(k for b in held for k in b.keys) == sorted(expected)
    assert all(same_bytes(b, expected) for b in held)
    assert len(peak) == 2 and all(n == 3 for n in peak.values()), peak  # the control file and 2 slots


def test_no_room_in_shared_memory_falls_back_to_pickling(dataset_dir, tmp_path, monkeypatch):
    ds, expected = dataset_dir

    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)  # inherited by the forked workers
    pid_dir = tmp_path / "pids"
    keys = []
    for batch in _loader(ds, num_workers=2, multiprocessing_context="fork", pid_dir=pid_dir):
        assert same_bytes(batch, expected)
        assert not isinstance(batch._block.base, mmap.mmap)  # its bytes came pickled, not in a slot
        keys += batch.keys
    assert len(_pids(pid_dir)) == 2
    assert sorted(keys) == sorted(expected)


def _sample(key, **members):
    return {"__key__": key, "__shard__": "file:///data/shard-000003.tar", **members}


def test_a_batch_with_no_bytes_members_keeps_labels_and_other_fields():
    batch = ByteCollate(label_field="cls")([_sample("a", cls=b"1", n=3), _sample("b", cls=b"2", n=4)])
    assert batch.fields == () and batch.nbytes == 0 and batch.data.numel() == 0
    assert batch.labels.tolist() == [1, 2] and batch["n"] == [3, 4] and batch["__key__"] == ["a", "b"]


def test_errors():
    collate = ByteCollate(label_field="cls")
    with pytest.raises(ValueError, match="empty batch"):
        collate([])
    with pytest.raises(ValueError, match="empty batch"):
        ByteCollate()([])
    # one member more, one fewer, one different
    for odd in (
        _sample("b", jpg=b"2", cls=b"1", png=b"x"),
        _sample("b", cls=b"1"),
        _sample("b", png=b"2", cls=b"1"),
    ):
        with pytest.raises(ValueError, match=r"shard-000003\.tar: sample 'b' .*same members"):
            collate([_sample("a", jpg=b"1", cls=b"0"), odd])
    with pytest.raises(ValueError, match="sample 'b' .*same members"):
        ByteCollate()([_sample("a", jpg=b"1"), _sample("b", jpg=b"1", cls=b"2")])
    for bad in (b"cat", b"", b"1.5"):
        with pytest.raises(
            ValueError, match=r"file:///data/shard-000003\.tar: sample 'b' member 'cls' is not an integer"
        ):
            collate([_sample("a", jpg=b"1", cls=b"0"), _sample("b", jpg=b"2", cls=bad)])
    batch = collate([_sample("a", jpg=b"1", cls=b" 12\n"), _sample("b", jpg=b"", cls=memoryview(b"-3"))])
    assert batch.labels.tolist() == [12, -3] and [bytes(v) for v in batch["jpg"]] == [b"1", b""]


@pytest.mark.slow
def test_a_non_integer_label_from_a_worker_names_shard_and_key(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"{i:03d}.jpg").write_bytes(b"x" * i)
        (src / f"{i:03d}.cls").write_bytes(b"dog" if i == 5 else b"1")
    pack(src, tmp_path / "ds", progress=False)
    loader = _loader(tmp_path / "ds", batch_size=4, num_workers=1)
    with pytest.raises(ValueError, match=r"data-000000\.tar: sample '005' member 'cls' is not an integer") as raised:
        list(loader)
    del raised, loader  # the iterator, in the traceback: its shutdown here (torch waits 5 s on a worker that raised)
    gc.collect()


def test_pickle_round_trip_of_an_in_memory_batch(dataset_dir):
    ds, expected = dataset_dir
    (first, *_) = _loader(ds, num_workers=0)
    for batch in (first, ByteCollate()([_sample("a", jpg=b"")])):
        again = pickle.loads(pickle.dumps(batch))
        assert isinstance(again, ByteBatch) and again is not batch
        assert (again.keys, again.fields, again.extras, again.nbytes) == (
            batch.keys,
            batch.fields,
            batch.extras,
            batch.nbytes,
        )
        assert torch.equal(again.data, batch.data) and torch.equal(again.offsets, batch.offsets)
        assert (again.labels is None) == (batch.labels is None)
        if batch.labels is not None:
            assert torch.equal(again.labels, batch.labels)
        for f in batch.fields:
            assert [bytes(v) for v in again[f]] == [bytes(v) for v in batch[f]]
        assert repr(again) == repr(batch)
    assert same_bytes(pickle.loads(pickle.dumps(first)), expected)


def test_a_batch_from_a_worker_pickles_with_its_bytes(dataset_dir):
    ds, expected = dataset_dir
    batches = list(_loader(ds, num_workers=2))
    payload = pickle.dumps(batches[1])
    assert len(payload) > batches[1].nbytes  # the bytes themselves, not a slot's name
    del batches
    gc.collect()
    list(_loader(ds, num_workers=2))  # the slots are reused by others meanwhile
    assert same_bytes(pickle.loads(payload), expected)


@pytest.mark.slow
def test_a_batch_collected_by_the_cyclic_gc_while_a_slot_is_mapped_does_not_deadlock():
    """The training process frees a batch's slot from a weakref finalizer; the cyclic GC can
    run it in the middle of mapping another slot (at any allocation there), in the same thread."""
    script = textwrap.dedent(
        """
        import faulthandler, os
        print(os.getpid(), flush=True)
        from shardstream import collate
        from shardstream.storage.shm import SharedFile

        faulthandler.dump_traceback_later(15, exit=True)  # the loop's bound, the imports apart

        control = SharedFile("shardstream-batch", collate.MAX_SLOTS)
        slot = SharedFile("shardstream-batch", 1 << 16)
        for i in range(2000):
            batch = collate._from_slot(slot.path, control.path, 0, 64, 0, (), [], False, {})
            batch.cycle = batch  # in a reference cycle (a traceback, a user's structure), then dropped
            del batch
            other = SharedFile("shardstream-batch", 4096)  # a worker's new slot, mapped
            collate._mapped(other.path)
            del other
        print("done")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pid, *out = done.stdout.split()
    for path in SHM.glob(f"{PREFIX}-{int(pid)}-*"):  # left by a process that was stopped
        path.unlink(missing_ok=True)
    assert done.returncode == 0 and out == ["done"], done.stderr[-3000:]


def test_mapping_a_new_slot_drops_the_mappings_of_exited_workers_only(tmp_path):
    """One liveness check a worker, not one a mapped file: a file of an exited process goes,
    a running one's and a name without a process id stay."""
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(exited.stdout)
    paths = [
        SHM / f"{PREFIX}-{os.getpid()}-kept",
        tmp_path / "no-process-id",
        SHM / f"{PREFIX}-{dead}-gone",
        SHM / f"{PREFIX}-{os.getpid()}-new",
    ]
    try:
        for path in paths:
            path.write_bytes(b"\0" * 4096)
        for path in paths[:3]:
            collate_module._mapped(str(path))
        assert {str(p) for p in paths[:3]} <= set(collate_module._maps)
        collate_module._mapped(str(paths[3]))
        held = set(collate_module._maps)
        assert {str(paths[0]), str(paths[1]), str(paths[3])} <= held and str(paths[2]) not in held
    finally:
        for path in paths:
            collate_module._maps.pop(str(path), None)
            collate_module._makers.pop(str(path), None)
            path.unlink(missing_ok=True)
