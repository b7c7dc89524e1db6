"""Mid-epoch resume of ShardDataset through a plain DataLoader (loader_state_dict) and through
torchdata's StatefulDataLoader; len(), drop_last and resampled mode."""

from __future__ import annotations

import json
import shutil

import pytest
from resume_check import check_resume, plain, stateful, whole_epoch
from test_dataset import make_dataset

from shardstream import ShardDataset


def key_of(sample):
    return sample["__key__"]


@pytest.fixture
def dataset_dir(tmp_path):
    return make_dataset(tmp_path, num_samples=117, per_shard=8)  # 15 shards, the last of 5


@pytest.mark.parametrize(("num_workers", "stop"), [(0, 4), (2, 5), (2, 1)])
def test_plain_dataloader_resumes_where_it_stopped(dataset_dir, num_workers, stop):
    dest, keys = dataset_dir

    def make():
        return ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=4)

    run = check_resume(  # workers have read ahead into their buffers when the checkpoint is taken
        make,
        plain(batch_size=4, num_workers=num_workers),
        stop_after=stop,
        epoch=3,
        expected=keys,  # none repeated, none lost
    )
    before, after = run.taken, run.rest
    assert len(json.dumps(run.states[0][0])) < 1000  # a few numbers, no samples
    assert run.epochs == [3] and run.lengths == [len(keys) - len(before)]
    assert before != keys[: len(before)]  # shuffled: what was consumed is no prefix of the index
    if num_workers == 0:  # one reader continues its order exactly (with workers, a plain DataLoader
        # restarts its round-robin at worker 0: the same samples, in another order)
        assert before + after == whole_epoch(make, plain(batch_size=4), epoch=3)


def test_a_second_checkpoint_in_the_resumed_epoch_counts_from_the_first(dataset_dir):
    dest, keys = dataset_dir
    check_resume(
        lambda: ShardDataset(dest, decode=key_of, shuffle_buffer=10),
        plain(batch_size=5, num_workers=2),
        stop_after=[3, 6],  # a checkpoint after 3 batches; resumed, another after 6 more; resumed, the rest
        expected=keys,
    )


def test_stateful_dataloader_resumes_without_repeats(dataset_dir):
    dest, keys = dataset_dir
    run = check_resume(
        lambda: ShardDataset(dest, decode=key_of, shuffle_buffer=10),
        stateful(batch_size=4, num_workers=2),
        stop_after=7,
        expected=keys,
    )
    assert json.dumps(run.states[0][0]).count('"format": "shardstream-state"') == 2  # each worker's own state, used


def test_a_state_for_other_data_or_settings_is_refused(dataset_dir, tmp_path):
    dest, _ = dataset_dir
    state = ShardDataset(dest).state_dict(0)
    with pytest.raises(ValueError, match="seed: checkpoint 0, dataset 9"):
        ShardDataset(dest, seed=9).load_state_dict(state)
    other, _ = make_dataset(tmp_path / "other", num_samples=30)
    with pytest.raises(ValueError, match="num_samples: checkpoint 117, dataset 30"):
        ShardDataset(other).load_state_dict(state)
    with pytest.raises(ValueError, match="not a shardstream state"):
        ShardDataset(dest).load_state_dict({"epoch": 1})
    (tmp_path / "bare").mkdir()
    bare = ShardDataset([shutil.copy(p, tmp_path / "bare") for p in sorted(dest.glob("*.tar"))])  # no tables beside
    with pytest.raises(TypeError, match="needs a dataset with an index"):
        len(bare)
    with pytest.raises(TypeError, match="needs a dataset with an index"):
        bare.state_dict(0)


@pytest.mark.parametrize(("world_size", "drop_last", "expected"), [(2, False, 59), (2, True, 58), (4, False, 30)])
def test_len_is_the_count_of_each_rank(dataset_dir, monkeypatch, world_size, drop_last, expected):
    dest, keys = dataset_dir
    seen = []
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        dataset = ShardDataset(dest, drop_last=drop_last, decode=key_of)
        assert len(dataset) == expected
        mine = list(dataset)
        assert len(mine) == expected
        seen += mine
    assert set(seen) <= set(keys) and len(set(seen)) == min(len(keys), expected * world_size)


def test_resampled_draws_with_replacement_forever(dataset_dir):
    dest, keys = dataset_dir
    stream = iter(ShardDataset(dest, resampled=True, decode=key_of, seed=1))
    drawn = [next(stream) for _ in range(500)]
    assert set(drawn) <= set(keys) and len(set(drawn)) < len(drawn)
    again = iter(ShardDataset(dest, resampled=True, decode=key_of, seed=1))
    assert [next(again) for _ in range(500)] == drawn
    other = iter(ShardDataset(dest, resampled=True, decode=key_of, seed=2))
    assert [next(other) for _ in range(500)] != drawn
    with pytest.raises(TypeError):
        len(ShardDataset(dest, resampled=True))
