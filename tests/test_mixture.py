"""Mixtures of datasets (shardstream.Source): per-epoch counts by the largest remainder, coverage
of sub-sampled and repeated sources across epochs, stratified batches, DataLoader workers,
resume (same shape, elastic, across an epoch boundary), a changed mixture, replication."""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from resume_check import check_resume, checkpoint_after, plain, stateful
from torch.utils.data import DataLoader

from shardstream import ShardDataset, Source, pack
from shardstream.reading.mixture import apportion, epoch_counts


def make_source(root: Path, name: str, num_samples: int, per_shard: int) -> Path:
    """A dataset of ``num_samples`` one-member samples keyed ``name/NNNNN``, packed by
    shardstream with at most ``per_shard`` samples a shard."""
    src = root / f"src-{name}" / name
    src.mkdir(parents=True)
    for i in range(num_samples):
        (src / f"{i:05d}.txt").write_text(f"{name} {i}")
    pack(src.parent, root / name, max_samples_per_shard=per_shard, progress=False)
    return root / name


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mixture")
    return {
        "web": make_source(root, "web", 500, 37),  # unequal shards: the last holds 19
        "cur": make_source(root, "cur", 60, 7),
        "syn": make_source(root, "syn", 23, 5),
    }


def tag(sample):
    return f"{sample['__source__']}|{sample['__key__']}"


def mixture(sources, **kwargs) -> ShardDataset:
    """web by weight 0.6, cur by weight 0.3 (85 of 60: once and 25 more), syn twice (46)."""
    settings = {"epoch_samples": 300, "shuffle_buffer": 20, "seed": 3, "decode": tag, "batch_size": 10, **kwargs}
    return ShardDataset(
        [
            Source(sources["web"], weight=0.6, name="web"),
            Source(sources["cur"], weight=0.3, name="cur"),
            Source(sources["syn"], repeat=2.0, name="syn"),
        ],
        **settings,
    )


def per_source(tags) -> collections.Counter:
    return collections.Counter(t.split("|")[0] for t in tags)


def read(dataset, *, num_workers=0, batch_size=10) -> list[str]:
    return [t for batch in DataLoader(dataset, batch_size=batch_size, num_workers=num_workers) for t in batch]


# --- counting rules -------------------------------------------------------------------------


def test_counts_follow_the_rules_and_sum_exactly_by_the_largest_remainder():
    mix = [Source("a", weight=0.6), Source("b", weight=0.3), Source("c", repeat=2.0), Source("d", samples=7)]
    # c: 2 x 23 = 46, d: 7, so the weights share 300 - 53 = 247: 164.67 and 82.33
    assert epoch_counts(mix, [500, 60, 23, 9], 300) == [165, 82, 46, 7]
    thirds = [Source("a", weight=1), Source("b", weight=1), Source("c", weight=1)]
    assert epoch_counts(thirds, [9, 9, 9], 100) == [34, 33, 33]  # ties go to the earlier source
    assert epoch_counts([Source("a", repeat=0.1), Source("b")], [1000, 17], None) == [100, 17]
    assert epoch_counts([Source("a", repeat=0.25), Source("b", repeat=0.25)], [6, 6], None) == [2, 1]  # 1.5 + 1.5
    rng = random.Random(0)
    for _ in range(200):
        k = rng.randint(1, 6)
        weights = [rng.random() for _ in range(k)]
        total = rng.randint(1, 10**9)
        counts = epoch_counts([Source(str(i), weight=w) for i, w in enumerate(weights)], [1] * k, total)
        assert sum(counts) == total
        assert all(abs(c - total * w / sum(weights)) < 1 for c, w in zip(counts, weights))


@pytest.mark.parametrize(
    ("mix", "sizes", "epoch_samples", "message"),
    [
        ([Source("a", weight=0.5), Source("b", samples=3)], [9, 9], None, "'a' need ShardDataset\\(epoch_samples"),
        ([Source("a", weight=0), Source("b", weight=0)], [9, 9], 10, "weights of 'a', 'b' sum to 0"),
        ([Source("a"), Source("b", repeat=2.0)], [9, 0], None, "Source 'b' holds no samples"),
        ([Source("a", weight=1), Source("b", samples=30)], [9, 9], 20, "leaves -10 samples for the weight= sources"),
        ([Source("a"), Source("b")], [9, 9], 20, "epoch_samples=20 but the sources add up to 18"),
    ],
)
def test_bad_mixtures_are_errors_naming_the_source(mix, sizes, epoch_samples, message):
    with pytest.raises(ValueError, match=message):
        epoch_counts(mix, sizes, epoch_samples)


def test_a_source_takes_one_rule():
    with pytest.raises(ValueError, match="Source 'x': give one of weight=, repeat=, samples="):
        Source("s3://b/x", weight=1.0, repeat=2.0, name="x")
    with pytest.raises(ValueError, match="repeat=-1"):
        Source("/d", repeat=-1)


def test_apportioned_rounds_hold_floor_or_ceil_and_totals_are_exact():
    rng = random.Random(1)
    for _ in range(300):
        k = rng.randint(2, 7)
        quotas = [rng.randint(0, 5000) for _ in range(k)]
        quotas[0] += 1
        size = rng.randint(1, 300)
        n = sum(quotas)
        lengths = [size] * (n // size) + ([n % size] if n % size else [])
        rounds = apportion(lengths, quotas)
        share = np.outer(lengths, quotas) / n
        assert (rounds >= np.floor(share)).all() and (rounds <= np.ceil(share)).all()
        running = np.cumsum(rounds, axis=0) - np.cumsum(share, axis=0)
        assert np.abs(running).max() < 1
        assert rounds.sum(axis=0).tolist() == quotas


# --- reading ----------------------------------------------------------------------------------


def test_every_epoch_has_exact_counts_per_source_and_stratified_batches(sources):
    dataset = mixture(sources)
    assert dataset.samples_per_source == {"web": 169, "cur": 85, "syn": 46} and len(dataset) == 300
    share = {name: 10 * n / 300 for name, n in dataset.samples_per_source.items()}
    for epoch in range(3):
        dataset.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=10, num_workers=2)
        batches = list(loader)
        tags = [t for b in batches for t in b]
        assert per_source(tags) == dataset.samples_per_source
        for batch in batches:  # each batch the floor or ceil of each source's share
            counts = per_source(batch)
            assert all(int(share[name]) <= counts[name] <= -int(-share[name] // 1) for name in share), counts
        keys = collections.Counter(tags)
        assert max(n for t, n in keys.items() if t.startswith("syn|")) == 2  # repeat=2.0: each twice
        assert len({t for t in tags if t.startswith("syn|")}) == 23
        assert len({t for t in tags if t.startswith("cur|")}) == 60  # 85 of 60: all once, 25 twice
        assert max(keys[t] for t in keys if t.startswith("cur|")) == 2
    assert dataset.stats().source_samples == dataset.samples_per_source  # the workers of the latest epoch


def test_epochs_differ_and_repeat_for_the_same_seed(sources):
    a, b = mixture(sources), mixture(sources)
    a.set_epoch(1)
    b.set_epoch(1)
    first = read(a)
    assert first == read(b)
    a.set_epoch(2)
    assert read(a) != first


def test_a_sub_sampled_source_reads_no_sample_twice_until_it_read_them_all(sources):
    """10% of web a epoch (50 of 500, shards of 37 so epochs cut shards): 10 epochs read each
    sample once; the 11th starts the next permutation; never twice in an epoch."""
    dataset = ShardDataset(
        [Source(sources["web"], repeat=0.1, name="web"), Source(sources["syn"], name="syn")],
        decode=tag,
        shuffle_buffer=8,
        seed=5,
    )
    seen: list[str] = []
    for epoch in range(10):
        dataset.set_epoch(epoch)
        tags = [t for t in read(dataset, num_workers=2) if t.startswith("web|")]
        assert len(tags) == 50 == len(set(tags))
        seen += tags
    assert len(set(seen)) == 500  # each once
    dataset.set_epoch(10)
    assert len(set(read(dataset))) == 50 + 23


def test_coverage_runs_across_a_cycle_boundary_without_a_repeat_in_the_epoch(sources):
    """cur (60 samples) read 45 (samples=), 20 (repeat=1/3) or 165 (repeat=2.75: twice and 45
    more) a epoch: cycles of the coverage stream end inside epochs. Never a sample more than
    ceil(r) times in an epoch, each at least floor(r) times, and the coverage parts of the
    epochs are disjoint until the source has been read whole."""
    for rule in ({"samples": 45}, {"repeat": 1 / 3}, {"repeat": 2.75}):
        dataset = ShardDataset([Source(sources["cur"], name="cur", **rule)], decode=tag, shuffle_buffer=8, seed=2)
        n = dataset.samples_per_source["cur"]
        copies, part = divmod(n, 60)
        covered: set[str] = set()
        for epoch in range(8):
            dataset.set_epoch(epoch)
            tags = read(dataset, num_workers=2)
            counts = collections.Counter(tags)
            assert len(tags) == n
            assert max(counts.values()) <= copies + 1, (rule, epoch)
            assert min(counts.values()) >= copies and len(counts) == (60 if copies else n)
            extra = {t for t, c in counts.items() if c > copies}  # this epoch's coverage part
            assert len(extra) == part
            if (epoch + 1) * part <= 60:
                assert not extra & covered, (rule, epoch)
                covered |= extra
        assert len(covered) == 60 // part * part


def test_random_interleaving_keeps_counts(sources):
    dataset = mixture(sources, mix="random")
    tags = read(dataset, num_workers=2)
    assert per_source(tags) == dataset.samples_per_source
    stratified = read(mixture(sources))
    assert sorted(tags) != tags and tags != stratified


def test_ranks_get_equal_counts_and_their_share_of_each_source(sources, monkeypatch):
    for world_size in (2, 3, 4):
        union = []
        for rank in range(world_size):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world_size))
            dataset = mixture(sources)
            dataset.set_epoch(1)
            tags = read(dataset, num_workers=2)
            assert len(tags) == len(dataset) == -(-300 // world_size)
            for name, n in dataset.samples_per_source.items():
                assert abs(per_source(tags)[name] - len(tags) * n / 300) < 1
            union += tags
        full = collections.Counter(read_whole_epoch(sources, 1))
        got = collections.Counter(union)
        assert not full - got  # nothing lost
        assert sum((got - full).values()) == -(-300 // world_size) * world_size - 300  # the pad only


def read_whole_epoch(sources, epoch, **kwargs):
    """The epoch as one rank reads it (RANK / WORLD_SIZE set by a test put aside)."""
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        dataset = mixture(sources, **kwargs)
        dataset.set_epoch(epoch)
        return read(dataset)
    finally:
        os.environ.update(saved)


def test_replication_gives_each_group_the_same_samples_in_the_same_order(sources, monkeypatch):
    got = []
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "4")
        dataset = mixture(sources, replication=2)
        got.append(read(dataset, num_workers=2))
    assert got[0] == got[1] and got[2] == got[3] and got[0] != got[2]
    assert len(got[0]) == 150
    assert collections.Counter(got[0] + got[2]) == collections.Counter(read_whole_epoch(sources, 0))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="world_size=3 is not a multiple of replication=2"):
        len(mixture(sources, replication=2))


# --- resume -----------------------------------------------------------------------------------


def consume(dataset, *, num_workers, batches, batch_size=10):
    """Take ``batches`` batches from a fresh DataLoader iterator; the samples and the state."""
    return checkpoint_after(plain(batch_size, num_workers), dataset, batches)


def test_mid_epoch_resume_of_the_same_shape_continues_exactly(sources):
    run = check_resume(
        lambda: mixture(sources),
        plain(batch_size=10, num_workers=2),
        stop_after=7,
        epoch=2,
        expected=read_whole_epoch(sources, 2),
    )
    assert len(json.dumps(run.states[0][0])) < 3000
    assert run.lengths == [300 - 70]


def test_elastic_resume_4_2_3_loses_and_repeats_nothing(sources):
    run = check_resume(  # the ranks of each checkpoint save the same state (the helper checks it)
        lambda: mixture(sources),
        plain(batch_size=10, num_workers=2),
        stop_after=[3, 4],
        world_size=[4, 2, 3],
        epoch=4,
        expected=read_whole_epoch(sources, 4),  # nothing lost
        pads=(4 - 1) + (2 - 1) + (3 - 1),  # repeats only as pads
    )
    assert [len(tags) for tags in run.after] == run.lengths
    assert len({len(t) for t in run.after}) == 1


def test_statefulness_continues_coverage_over_an_epoch_boundary(sources):
    """A checkpoint at an epoch's end of a 10%-a-epoch source: the resumed job reads the next
    part of the permutation, as an uninterrupted one does."""

    def make():
        return ShardDataset([Source(sources["web"], repeat=0.1, name="web")], decode=tag, seed=8, batch_size=10)

    whole = make()
    expected = []
    for epoch in range(3):
        whole.set_epoch(epoch)
        expected.append(read(whole))
    run = check_resume(make, plain(batch_size=10), stop_after=5, epoch=0, expected=expected[0])  # all 50: its end
    assert run.states[0][0]["epoch_done"] and run.taken == expected[0]
    assert run.after == [[]]  # the rest of epoch 0
    assert read(run.datasets[0]) == expected[1]  # the next pass reads epoch 1


def test_a_changed_mixture_is_refused_mid_epoch_and_applies_from_an_epoch_end(sources):
    dataset = mixture(sources)
    dataset.set_epoch(0)
    _, mid = consume(dataset, num_workers=0, batches=3)
    changed = ShardDataset(
        [Source(sources["web"], weight=0.5, name="web"), Source(sources["cur"], weight=0.5, name="cur")],
        epoch_samples=300,
        decode=tag,
        shuffle_buffer=20,
        seed=3,
        batch_size=10,
    )
    with pytest.raises(ValueError, match=r"source 'syn' removed.*middle of epoch 0") as info:
        changed.load_state_dict(mid)
    assert "source 'web': rule {'weight': 0.6} -> {'weight': 0.5}" in str(info.value)
    _, end = consume(mixture(sources), num_workers=0, batches=30)
    assert end["epoch_done"]
    changed.load_state_dict(end)  # applies from epoch 1; web and cur continue their coverage
    assert changed.epoch == 1
    tags = read(changed)
    assert per_source(tags) == {"web": 150, "cur": 150}
    old_web = {t for t in read_whole_epoch(sources, 0) if t.startswith("web|")}
    assert not old_web & {t for t in tags if t.startswith("web|")}  # web goes on where it stood


def test_a_single_whole_source_is_todays_dataset(sources):
    assert [s["__key__"] for s in ShardDataset([Source(sources["cur"])], seed=1)] == [
        s["__key__"] for s in ShardDataset(sources["cur"], seed=1)
    ]


def test_a_mixture_needs_indexed_sources_and_distinct_names(sources, tmp_path):
    with pytest.raises(ValueError, match="two sources are named 'x'"):
        ShardDataset([Source(sources["cur"], name="x"), Source(sources["syn"], name="x")])
    (tmp_path / "bare").mkdir()
    bare = [shutil.copy(p, tmp_path / "bare") for p in sorted(sources["syn"].glob("*.tar"))]  # without their tables
    with pytest.raises(ValueError, match="Source 'bare' has no index"):
        ShardDataset([Source(bare, name="bare"), Source(sources["cur"])])
    with pytest.raises(TypeError, match="give every entry as Source"):
        ShardDataset([Source(sources["cur"]), str(sources["syn"])])


def test_an_s3_source_beside_a_local_one_through_the_node_cache(sources, tmp_path, s3_config, s3_bucket):
    """web on S3 (whole, through the node cache) and syn on disk read 0.5 times: the second
    epoch reads web's shards from the cache; counts and samples as from disk."""
    src = tmp_path / "src" / "web"
    src.mkdir(parents=True)
    for i in range(500):
        (src / f"{i:05d}.txt").write_text(f"web {i}")
    pack(src.parent, f"s3://{s3_bucket}/web", max_samples_per_shard=37, s3=s3_config, progress=False)
    dataset = ShardDataset(
        [Source(f"s3://{s3_bucket}/web", name="web"), Source(sources["syn"], repeat=0.5, name="syn")],
        s3=s3_config,
        cache_dir=tmp_path / "cache",
        cache_limit_bytes=1 << 30,
        decode=tag,
        batch_size=10,
    )
    for epoch in range(2):
        dataset.set_epoch(epoch)
        tags = read(dataset, num_workers=2)
        assert per_source(tags) == {"web": 500, "syn": 12} == dataset.stats().source_samples
        assert {t for t in tags if t.startswith("web|")} == {f"web|web/{i:05d}" for i in range(500)}
    stats = dataset.stats()
    assert stats.cache_hits > 0 and stats.cache_misses == 0  # epoch 1: every web shard from the cache


def test_stateful_dataloader_resumes_a_mixture(sources):
    check_resume(
        lambda: mixture(sources),
        stateful(batch_size=10, num_workers=2),
        stop_after=8,
        expected=read_whole_epoch(sources, 0),
    )


def test_the_rounds_of_many_workers_replay_together_as_one_by_one():
    from shardstream.reading.mixture import apportion_prefix

    rng = random.Random(4)
    for _ in range(200):
        rows, k, size = rng.randint(1, 6), rng.randint(1, 5), rng.randint(1, 20)
        totals = [rng.randint(0, 300) for _ in range(rows)]
        quotas = [np.diff([0, *sorted(rng.randint(0, t) for _ in range(k - 1)), t]).tolist() for t in totals]
        upto = [rng.randint(0, -(-t // size)) for t in totals]
        twice = rng.randrange(rows)  # a row repeated, as workers of other ranks repeat each other
        totals, quotas, upto = totals + [totals[twice]], quotas + [quotas[twice]], upto + [upto[twice]]
        rows += 1
        before, current = apportion_prefix(size, np.array(totals), np.array(quotas).reshape(rows, k), np.array(upto))
        for i, total in enumerate(totals):
            lengths = [size] * (total // size) + ([total % size] if total % size else [])
            one = apportion(lengths, quotas[i]) if lengths else np.zeros((0, k), np.int64)
            assert before[i].tolist() == one[: upto[i]].sum(axis=0).tolist()
            assert current[i].tolist() == (one[upto[i]].tolist() if upto[i] < len(lengths) else [0] * k)
