"""Epochs advance wherever a user trains: set_epoch reaches persistent DataLoader workers, a
pass without set_epoch reads the next epoch (warned once), an explicit set_epoch wins, and
len / resume hold with persistent workers as without."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from resume_check import check_resume, plain, stateful
from test_dataset import make_dataset
from torch.utils.data import DataLoader

from shardstream import ShardDataset
from shardstream.dataset import loader_state_dict


def key_of(sample):
    return sample["__key__"]


def flat(batches) -> list[str]:
    return [k for b in batches for k in b]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("epochs"), num_samples=117, per_shard=8)  # 15 shards, the last of 5


def make(dest):
    """A maker of fresh datasets of ``dest`` as these tests read them."""
    return lambda: ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)


def reference(dest, epoch: int, num_workers: int) -> list[str]:
    """Epoch ``epoch`` as a fresh dataset and a fresh DataLoader read it."""
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)
    dataset.set_epoch(epoch)
    return flat(DataLoader(dataset, batch_size=4, num_workers=num_workers))


@pytest.mark.parametrize("persistent", [False, True])
def test_set_epoch_reaches_persistent_workers(dataset_dir, persistent):
    dest, keys = dataset_dir
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=persistent)
    epochs = []
    for epoch in (4, 1, 6):  # not consecutive: each pass reads the epoch set, not one more than the last
        dataset.set_epoch(epoch)
        assert len(dataset) == len(keys) and dataset.epoch == epoch
        epochs.append(flat(loader))
        assert sorted(epochs[-1]) == sorted(keys)  # every sample once
    assert epochs == [reference(dest, e, num_workers=2) for e in (4, 1, 6)]  # as fresh workers read them
    assert len({tuple(e) for e in epochs}) == 3  # three different orders


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_each_pass_without_set_epoch_reads_the_next_epoch(dataset_dir, num_workers, persistent, capfd, log_to_stderr):
    dest, keys = dataset_dir
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)
    loader = DataLoader(dataset, batch_size=4, num_workers=num_workers, persistent_workers=persistent)
    passes = [flat(loader) for _ in range(3)]
    assert dataset.epoch == 2
    dataset.set_epoch(7)  # an explicit epoch wins over the count
    seventh = flat(loader)
    eighth = flat(loader)
    err = capfd.readouterr().err
    advanced = [line for line in err.splitlines() if "started without set_epoch()" in line]
    assert passes == [reference(dest, e, num_workers) for e in (0, 1, 2)]
    assert seventh == reference(dest, 7, num_workers) and eighth == reference(dest, 8, num_workers)
    assert len(advanced) == 1 and "reads epoch 1" in advanced[0]  # once per dataset, in whichever process


def test_a_pass_repeats_an_epoch_only_when_told_to(dataset_dir, caplog):
    dest, _ = dataset_dir
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)
    dataset.set_epoch(4)
    first = list(dataset)
    dataset.set_epoch(4)
    assert list(dataset) == first
    assert "set_epoch" not in caplog.text  # explicit epochs never warn


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_with_persistent_workers_and_the_epoch_after(dataset_dir, persistent):
    dest, keys = dataset_dir
    how = plain(batch_size=4, num_workers=2, persistent_workers=persistent)

    def after_epoch_0(dataset):  # the loader read epoch 0; the pass it checkpoints reads epoch 1, without set_epoch
        loader = how.open(dataset)
        flat(loader)
        return loader

    run = check_resume(make(dest), replace(how, open=after_epoch_0), stop_after=5, expected=keys)
    assert run.states[0][0]["epoch"] == 1
    assert run.lengths == [len(keys) - len(run.taken)] and run.epochs == [1]
    fresh, resumed_loader = run.datasets[0], run.loaders[0]
    assert len(fresh) == len(keys)  # the pass after the resumed one is a whole epoch
    following = flat(resumed_loader)  # epoch 2, without set_epoch
    assert fresh.epoch == 2 and following == reference(dest, 2, num_workers=2)


def test_a_checkpoint_loaded_after_persistent_workers_started_reaches_them(dataset_dir):
    dest, keys = dataset_dir
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True)

    def same_loader(resumed, state):  # the same dataset and loader, its workers alive since epoch 5
        resumed.set_epoch(0)
        flat(loader)  # the workers read a whole other epoch meanwhile
        resumed.load_state_dict(state)
        resumed.set_epoch(5)  # the loaded epoch: keeps the checkpoint's place
        return loader

    how = replace(plain(batch_size=4, num_workers=2), open=lambda _: loader, resume=same_loader)
    check_resume(lambda: dataset, how, stop_after=3, epoch=5, expected=keys)


def test_workers_that_would_read_different_epochs_raise(dataset_dir):
    dest, _ = dataset_dir
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)
    flat(DataLoader(dataset, batch_size=4, num_workers=1))
    it = iter(DataLoader(dataset, batch_size=4, num_workers=2))  # its worker 1 never read epoch 0
    # the worker that starts first raises: worker 0 in batch 0 (it counts [2, 0] or [2, 1]), or,
    # on a loaded machine, worker 1 in batch 1 ([1, 1]: worker 0's row is the first DataLoader's;
    # worker 0, starting after it, sees a sibling of its own DataLoader and yields batch 0)
    with pytest.raises(
        ValueError, match=r"DataLoader workers of this ShardDataset have read \[(2, [01]|1, 1)\] passes"
    ):
        next(it)
        next(it)
    dataset.set_epoch(1)  # while that iterator's worker 1 may still be starting: it keeps its own epoch
    assert sorted(flat(DataLoader(dataset, batch_size=4, num_workers=2))) == sorted(reference(dest, 0, 0))


@pytest.mark.parametrize("persistent", [False, True])
def test_stateful_dataloader_resumes_then_advances(dataset_dir, persistent):
    dest, keys = dataset_dir
    how = stateful(batch_size=4, num_workers=2, persistent_workers=persistent)
    loaders = []

    def after_epoch_0(dataset):  # the loader read epoch 0; the pass it checkpoints reads epoch 1
        loaders.append(how.open(dataset))
        flat(loaders[-1])
        return loaders[-1]

    def resumed_and_counted(dataset, state):
        resumed = how.resume(dataset, state)
        assert len(resumed) == len(loaders[0])  # the epoch's whole length, as StatefulDataLoader counts
        return resumed

    run = check_resume(
        make(dest), replace(how, open=after_epoch_0, resume=resumed_and_counted), stop_after=6, expected=keys
    )
    resumed_dataset, resumed = run.datasets[0], run.loaders[0]
    following = flat(resumed)
    assert resumed_dataset.epoch == 2 and following == reference(dest, 2, num_workers=2)


@pytest.mark.parametrize(("num_workers", "batch_size"), [(2, 4), (3, 5), (2, 16)])
def test_with_its_batch_size_the_dataloader_yields_len_loader_batches(dataset_dir, num_workers, batch_size):
    dest, keys = dataset_dir  # 117 samples: no worker count divides them evenly into whole batches
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3, batch_size=batch_size)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    batches = list(loader)
    assert len(batches) == len(loader) == -(-len(keys) // batch_size)  # what Lightning and HF stop at
    assert [len(b) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert sorted(flat(batches)) == sorted(keys)
    with pytest.raises(ValueError, match="the DataLoader.s batch_size is 3"):
        loader_state_dict(DataLoader(dataset, batch_size=3), samples_consumed=0)


def test_workers_without_the_batch_size_are_logged_once(dataset_dir, capfd, log_to_stderr):
    dest, keys = dataset_dir
    dataset = ShardDataset(dest, decode=key_of, shuffle_buffer=10, seed=3)
    loader = DataLoader(dataset, batch_size=8, num_workers=2)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader) + 1 and sorted(flat(batches)) == sorted(keys)  # 59 + 58: two short
    logged = [line for line in capfd.readouterr().err.splitlines() if "without ShardDataset(batch_size=...)" in line]
    assert len(logged) == 1


@pytest.mark.slow
def test_a_dataset_unpickled_after_its_creator_exited_starts_afresh(dataset_dir, tmp_path):
    """A pickled ShardDataset loaded in another process once the process that made it has
    exited (its shared files are gone) gets new ones and keeps its epoch."""
    import pickle
    import subprocess

    dest, keys = dataset_dir
    saved = tmp_path / "dataset.pkl"
    make = (
        "import pickle, sys; from shardstream import ShardDataset; "
        "d = ShardDataset(sys.argv[1], shuffle_buffer=10, seed=3); d.set_epoch(4); "
        "pickle.dump(d, open(sys.argv[2], 'wb'))"
    )
    subprocess.run([sys.executable, "-c", make, str(dest), str(saved)], check=True, timeout=120)
    dataset = pickle.loads(saved.read_bytes())
    assert dataset.epoch == 4 and [s["__key__"] for s in dataset] == reference(dest, 4, num_workers=0)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=lambda batch: [key_of(x) for x in batch])
    assert flat(loader) == reference(dest, 4, num_workers=2)  # workers count their own passes
    assert flat(loader) == reference(dest, 5, num_workers=2)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_another_dataloaders_workers_are_told_apart_whichever_starts_first(order):
    """The check behind the test above, without its race: worker 1 starting before worker 0
    used to see worker 0's count from the earlier 1-worker DataLoader and take it for this
    one's; each worker now records which DataLoader's processes it belongs to."""
    from shardstream.reading.epochs import EpochBoard

    def start(board, worker_id, num_workers, loader):
        board.start_pass(rank=0, worker_id=worker_id, num_workers=num_workers, loaded=None, copied=None, loader=loader)

    board = EpochBoard()
    board.set(0, [])
    start(board, 0, 1, loader=11)  # a DataLoader with 1 worker reads a pass
    with pytest.raises(ValueError, match=r"have read \[\d, \d\] passes"):
        for worker_id in order:  # then one with 2 workers
            start(board, worker_id, 2, loader=22)
    for persistent in (False, True):  # what must pass: 2 workers, 3 passes, in either order
        board = EpochBoard()
        board.set(0, [])
        for loader in (5, 6, 7):
            for worker_id in order:
                start(board, worker_id, 2, loader=5 if persistent else loader)
