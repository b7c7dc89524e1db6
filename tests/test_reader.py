"""The reader's seams as a user meets them: what ShardDataset(collate=...) accepts and calls
(a plain collate_fn, one that can also gather file runs, a Batcher object), the one label
parser, and the skip-and-repeat every reader and DALI's feed share."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstream import Batcher, CollateBatcher, RunBatcher, ShardDataset, Source, pack
from shardstream.errors import DecodeError
from shardstream.reading.batching import as_batcher, parse_label
from shardstream.reading.repeat import Repeater

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    """40 samples in shards of 10: a ``.bin`` and an ASCII ``.cls`` each."""
    root = tmp_path_factory.mktemp("reader")
    src = root / "src"
    src.mkdir()
    for i in range(40):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * (i + 1))
        (src / f"{i:03d}.cls").write_bytes(str(i % 4).encode())
    pack(src, root / "ds", max_samples_per_shard=10, progress=False)
    return root / "ds"


def test_a_collate_fn_is_called_with_the_samples_whatever_attributes_it_has(dataset_dir):
    def collate(samples):
        return [s["__key__"] for s in samples]

    collate.from_samples = "not a method"  # an unrelated attribute: still a collate_fn
    batches = list(ShardDataset(dataset_dir, shuffle=False, batch_size=16, collate=collate))
    assert batches == [[f"{i:03d}" for i in range(a, min(a + 16, 40))] for a in (0, 16, 32)]


def test_a_collate_fn_that_gathers_file_runs_gets_them_in_shard_order(dataset_dir):
    class Gathering:
        def __init__(self):
            self.gathered = 0

        def __call__(self, samples):
            return ("samples", [s["__key__"] for s in samples])

        def gather(self, pieces):  # the name ByteCollate's method had before from_runs
            self.gathered += 1
            return ("runs", [key for run, i, j in pieces for key in run.keys[i:j]])

    collate = Gathering()
    batches = list(ShardDataset(dataset_dir, shuffle=False, batch_size=16, collate=collate))
    assert [kind for kind, _ in batches] == ["runs"] * 3 and collate.gathered == 3
    assert [k for _, keys in batches for k in keys] == [f"{i:03d}" for i in range(40)]
    decoded = ShardDataset(dataset_dir, shuffle=False, batch_size=16, collate=collate, decode=lambda s: s)
    assert [kind for kind, _ in decoded] == ["samples"] * 3  # decoded samples never come as runs


def test_a_batcher_object_is_used_as_is_and_anything_else_is_refused(dataset_dir):
    class Counting:
        def from_samples(self, samples):
            return len(samples)

    assert list(ShardDataset(dataset_dir, shuffle=False, batch_size=16, collate=Counting())) == [16, 16, 8]
    assert isinstance(Counting(), Batcher) and not isinstance(Counting(), RunBatcher)
    assert isinstance(as_batcher(len), CollateBatcher) and not isinstance(as_batcher(len), RunBatcher)
    with pytest.raises(ValueError, match=r"collate=42 must be callable \(a DataLoader collate_fn\)"):
        ShardDataset(dataset_dir, batch_size=4, collate=42)


def test_labels_are_parsed_once_for_every_batcher():
    sample = {"__key__": "k", "__shard__": "file:///d/data-000000.tar"}
    assert [parse_label({**sample, "cls": v}, "cls") for v in (b" 7\n", "8", 9, memoryview(b"10"))] == [7, 8, 9, 10]
    with pytest.raises(
        DecodeError, match=r"data-000000\.tar: sample 'k' member 'cls' is not an integer label \(b'x'\); hint"
    ):
        parse_label({**sample, "cls": b"x"}, "cls", hint="; hint")


def test_skipped_items_are_replaced_by_repeats_of_a_good_neighbour():
    repeater = Repeater(lambda good, skipped: (good[0], skipped[1]))
    taken = [repeater.take((v, i), skipped=v is None) for i, v in enumerate([None, None, "a", None, "b", None])]
    assert taken == [[], [], [("a", 2)] * 3, [("a", 3)], [("b", 4)], [("b", 5)]]
    assert repeater.skipped == 4 and repeater.owed == 0
    nothing = Repeater()
    assert nothing.take(None, skipped=True) == [] and nothing.owed == 1


def test_a_dataset_names_its_sources(dataset_dir):
    assert ShardDataset(dataset_dir).sources is None
    assert ShardDataset(Source(dataset_dir)).sources is None  # one whole source is one dataset
    mixed = ShardDataset([Source(dataset_dir, name="a"), Source(dataset_dir, name="b")])
    assert [s.label for s in mixed.sources] == ["a", "b"] and mixed.samples_per_source == {"a": 40, "b": 40}
