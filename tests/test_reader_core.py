"""The torch-free reader: ``Reader`` and ``ReadingEngine`` driven directly, in an interpreter
where importing torch is impossible (``sys.modules["torch"] = None``), as a program that never
installed torch would run them. One subprocess (this file run as a script) packs a small
dataset with ``shardstream.packing.pack``, reads it as below and writes what it read; the tests
check it: one epoch yields every sample once, two workers together too, a resume from
``schedule.reader_state`` yields exactly the rest, and the engine reads a worker's plan in the
plan's emission order. Who reads is a :class:`WorkerSlot` given by hand (no DataLoader), and
the slot, worker and DataLoader questions answer as in a plain process."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

NUM_SAMPLES = 50
PER_SHARD = 7  # 8 shards, the last of 1
EPOCH = 1
SETTINGS = {"seed": 3, "shuffle": True, "shuffle_buffer": 16, "max_open_shards": 2}  # lanes and a buffer


@pytest.fixture(scope="module")
def torch_free(tmp_path_factory) -> dict[str, Any]:
    """What the torch-free subprocess read (:func:`_read_without_torch`)."""
    root = tmp_path_factory.mktemp("reader-core")
    run = subprocess.run(
        [sys.executable, __file__, str(root)], capture_output=True, text=True, timeout=90, cwd=Path(__file__).parent
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads((root / "read.json").read_text())


def test_nothing_of_torch_is_loaded_and_the_slot_is_a_plain_processs(torch_free):
    assert torch_free["torch_modules"] == []  # only sys.modules["torch"] = None, which made imports fail
    assert torch_free["slot"] == {"rank": 0, "world_size": 1, "worker_id": 0, "num_workers": 1}
    assert torch_free["in_worker"] is False and torch_free["distributed_rank"] is None
    assert torch_free["torch_version"] is None and torch_free["fetcher_batch_size"] is None


def test_one_epoch_yields_every_sample_once(torch_free):
    keys = torch_free["keys"]
    assert len(keys) == len(set(keys)) == NUM_SAMPLES
    one = torch_free["one_reader"]
    assert sorted(one) == sorted(keys)
    assert one != keys  # shuffled: not the index order
    assert torch_free["one_reader_again"] == one  # a pass is a function of (seed, epoch, slot)


def test_two_workers_together_yield_every_sample_once(torch_free):
    first, second = torch_free["two_workers"]
    assert first and second and not set(first) & set(second)
    assert sorted(first + second) == sorted(torch_free["keys"])
    assert abs(len(first) - len(second)) <= 1  # split evenly (no batch size)


def test_a_resume_from_reader_state_yields_exactly_the_rest(torch_free):
    one = torch_free["one_reader"]
    resumed = torch_free["resume_one"]
    assert resumed["state_chars"] < 1000  # a few numbers, no samples
    assert resumed["before"] == one[: len(resumed["before"])] and len(resumed["before"]) == 13
    assert resumed["before"] + resumed["after"] == one  # one reader continues its order exactly
    parts = torch_free["resume_two"]
    for worker, part in enumerate(parts):
        assert part["before"] + part["after"] == torch_free["two_workers"][worker]
    union = [k for part in parts for k in part["before"] + part["after"]]
    assert collections.Counter(union) == collections.Counter(torch_free["keys"])  # none lost, none repeated


def test_the_engine_reads_a_worker_plan_in_its_emission_order(torch_free):
    plan = torch_free["plan"]
    assert plan["lanes"] == 2 and plan["capacity"] == 16  # the interleaving and the buffer both at work
    assert plan["read"] == plan["emitted"]
    assert plan["read"] == torch_free["two_workers"][0]  # what the reader hands out is the engine's read
    assert plan["emitted"] != sorted(plan["emitted"], key=torch_free["keys"].index)  # not in arrival order


def _read_without_torch(root: Path) -> dict[str, Any]:
    """Pack ``root/src`` into ``root/ds`` and read it with torch unimportable (see the module doc)."""
    import numpy as np

    from shardstream.config import FetchConfig
    from shardstream.index import open_index
    from shardstream.packing import pack
    from shardstream.reading import assign, loader
    from shardstream.reading.assign import WorkerSlot
    from shardstream.reading.engine import ReadingEngine
    from shardstream.reading.epochs import PassState
    from shardstream.reading.reader import Reader, ReadOptions
    from shardstream.reading.schedule import EpochSchedule
    from shardstream.reading.shards import IndexedShards
    from shardstream.reading.stats import FIELDS, ReaderStats

    src = root / "src"
    src.mkdir()
    for i in range(NUM_SAMPLES):
        (src / f"{i:03d}.txt").write_text(f"sample {i}")
    pack(src, root / "ds", max_samples_per_shard=PER_SHARD, progress=False)
    shards = IndexedShards(open_index(root / "ds"))
    keys = [key for shard in range(shards.num_shards) for key in shards.table(shard).keys()]  # by sample id
    engine = ReadingEngine(shards)
    schedule = EpochSchedule(shards, **SETTINGS)
    reader = Reader(schedule, [engine], ReadOptions(decode=lambda sample: sample["__key__"]))

    def stats() -> ReaderStats:
        return ReaderStats(np.zeros(len(FIELDS)))

    def open_pass(state: PassState, slot: WorkerSlot) -> tuple[Any, Any]:
        return reader.open(state, slot, fetch=FetchConfig(), stats=stats(), once=lambda flag: False)

    def read(slot: WorkerSlot) -> list[str]:
        return list(open_pass(PassState(EPOCH, []), slot)[1])

    def resume(slot: WorkerSlot, stop: int) -> dict[str, Any]:
        progress, items = open_pass(PassState(EPOCH, []), slot)
        before = [next(items) for _ in range(stop)]
        state = schedule.reader_state(
            PassState(EPOCH, []), slot, position=progress.position, yielded=progress.delivered
        )
        saved = json.dumps(state)
        _, rest = open_pass(schedule.loaded_state(json.loads(saved)), slot)
        return {"before": before, "after": list(rest), "state_chars": len(saved)}

    workers = [WorkerSlot(worker_id=w, num_workers=2) for w in range(2)]
    mine, _ = schedule.worker_plan(schedule.plan(PassState(EPOCH, []), workers[0]), workers[0])
    read_plan = [s["__key__"] for batch in engine.read_plan(mine, fetch=FetchConfig(), stats=stats()) for s in batch]
    slot = assign.current_slot()
    return {
        "keys": keys,
        "one_reader": read(WorkerSlot()),
        "one_reader_again": read(WorkerSlot()),
        "two_workers": [read(w) for w in workers],
        "resume_one": resume(WorkerSlot(), 13),
        "resume_two": [resume(w, stop) for w, stop in zip(workers, (5, 9))],
        "plan": {
            "lanes": mine.lanes,
            "capacity": mine.capacity,
            "emitted": [keys[mine.ids[arrival]] for arrival in mine.emissions()],
            "read": read_plan,
        },
        "slot": {k: getattr(slot, k) for k in ("rank", "world_size", "worker_id", "num_workers")},
        "in_worker": assign.in_worker(),
        "distributed_rank": assign.distributed_rank(),
        "torch_version": assign.loaded_torch_version(),
        "fetcher_batch_size": loader.fetcher_batch_size(object()),
        "torch_modules": sorted(m for m, v in sys.modules.items() if m.split(".")[0] == "torch" and v is not None),
    }


if __name__ == "__main__":  # the subprocess of the fixture: torch unimportable before shardstream is
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ModuleNotFoundError
    out = Path(sys.argv[1])
    (out / "read.json").write_text(json.dumps(_read_without_torch(out)))
