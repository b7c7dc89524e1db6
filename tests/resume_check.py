"""The one resume check of the tests: read part of a pass, checkpoint, resume on fresh datasets,
and the samples taken before and read after are exactly one epoch (none lost, none repeated
but the pads allowed), whatever reads them: a plain DataLoader (``loader_state_dict``),
torchdata's ``StatefulDataLoader``, the dataset iterated itself, or a loader of a test's own
(DALI) described as :class:`Checkpoints`.

    run = check_resume(lambda: ShardDataset(dest, decode=key_of), plain(batch_size=4, num_workers=2),
                       stop_after=5, epoch=3, expected=keys)

Several checkpoints in a row (``stop_after=[3, 6]``) and elastic resumes (``world_size=[4, 2,
3]``: a job of 4 ranks checkpoints, 2 go on and checkpoint, 3 read the rest) go through the
same call; ranks are ``RANK`` / ``WORLD_SIZE`` in the environment while each one is made and
read (as torchrun sets them), restored afterwards. What was read, saved and resumed comes back
as :class:`Resumed` for a test's own assertions (an order, a length, the next epoch).

Tests import it as they import ``isolation``: ``from resume_check import check_resume, plain``
(pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Checkpoints",
    "Resumed",
    "as_rank",
    "assert_one_epoch",
    "check_resume",
    "checkpoint_after",
    "direct",
    "plain",
    "stateful",
    "whole_epoch",
]


@dataclass(frozen=True)
class Checkpoints:
    """How a test reads a pass of a dataset and checkpoints it.

    Attributes:
        open: the dataset -> what a pass iterates (a loader, or the dataset itself).
        save: ``(loader, dataset, samples taken)`` -> the checkpoint after the batches taken.
        resume: ``(fresh dataset, checkpoint)`` -> what reads the rest of the pass.
        ids: a batch (as kept) -> the ids of its samples (hashable: keys, labels).
        keep: a batch as it comes -> what is kept of it (:attr:`Resumed.batches_before`), at
            once (a batch whose buffers are reused must be copied here).
        per_job: a checkpoint is the job's (the same on every rank, resumable at another world
            size: checked equal on every rank), not each rank's own (StatefulDataLoader's).
    """

    open: Callable[[Any], Iterable[Any]]
    save: Callable[[Any, Any, int], Any]
    resume: Callable[[Any, Any], Iterable[Any]]
    ids: Callable[[Any], Sequence[Any]] = list
    keep: Callable[[Any], Any] = lambda batch: batch
    per_job: bool = True


def plain(batch_size: int | None, num_workers: int = 0, **loader_options: Any) -> Checkpoints:
    """A plain ``torch.utils.data.DataLoader`` and ``loader_state_dict(loader, samples taken)``,
    through JSON as a checkpoint file holds it; resumed by ``dataset.load_state_dict``."""

    def loader(dataset: Any) -> Any:
        from torch.utils.data import DataLoader

        return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **loader_options)

    def save(loader: Any, dataset: Any, taken: int) -> Any:
        from shardstream import loader_state_dict

        return json.loads(json.dumps(loader_state_dict(loader, samples_consumed=taken)))

    def resume(dataset: Any, state: Any) -> Any:
        dataset.load_state_dict(state)
        return loader(dataset)

    return Checkpoints(open=loader, save=save, resume=resume)


def stateful(batch_size: int | None, num_workers: int = 0, **loader_options: Any) -> Checkpoints:
    """torchdata's ``StatefulDataLoader``: ``loader.state_dict()``, each rank's own, resumed by
    a fresh loader's ``load_state_dict`` (a map-style dataset: its sampler's state)."""

    def loader(dataset: Any) -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **loader_options)

    def resume(dataset: Any, state: Any) -> Any:
        resumed = loader(dataset)
        resumed.load_state_dict(state)
        return resumed

    return Checkpoints(
        open=loader, save=lambda loader, dataset, taken: loader.state_dict(), resume=resume, per_job=False
    )


def direct() -> Checkpoints:
    """The dataset iterated itself, a sample a step (``stop_after`` counts samples), and
    ``dataset.state_dict(samples_consumed=taken)``."""

    def resume(dataset: Any, state: Any) -> Any:
        dataset.load_state_dict(state)
        return dataset

    return Checkpoints(
        open=lambda dataset: dataset,
        save=lambda loader, dataset, taken: dataset.state_dict(samples_consumed=taken),
        resume=resume,
        ids=lambda sample: [sample],
    )


@dataclass
class Resumed:
    """What :func:`check_resume` read, saved and resumed.

    Attributes:
        before: per checkpoint, per rank: the ids taken before it.
        after: per rank of the resumed job: the ids it read to the end.
        states: per checkpoint, per rank: the checkpoint saved.
        batches_before, batches_after: the same as batches (as :attr:`Checkpoints.keep` kept them).
        lengths: per resumed rank, ``len()`` of its dataset once resumed, before it read (None
            where it has none).
        epochs: per resumed rank, its dataset's ``epoch`` then (None where it has none).
        datasets, loaders: the resumed ranks', to read on (the next epoch).
        opened: the loaders of the checkpointed passes (kept alive as a test's own would be).
    """

    before: list[list[list[Any]]] = field(default_factory=list)
    after: list[list[Any]] = field(default_factory=list)
    states: list[list[Any]] = field(default_factory=list)
    batches_before: list[list[list[Any]]] = field(default_factory=list)
    batches_after: list[list[Any]] = field(default_factory=list)
    lengths: list[int | None] = field(default_factory=list)
    epochs: list[int | None] = field(default_factory=list)
    datasets: list[Any] = field(default_factory=list)
    loaders: list[Any] = field(default_factory=list)
    opened: list[Any] = field(default_factory=list)

    @property
    def taken(self) -> list[Any]:
        """Every id taken before a checkpoint (checkpoints, then ranks, in order)."""
        return [i for ranks in self.before for ids in ranks for i in ids]

    @property
    def rest(self) -> list[Any]:
        """Every id read after the last checkpoint (ranks in order)."""
        return [i for ids in self.after for i in ids]


def check_resume(
    make_dataset: Callable[[], Any],
    how: Checkpoints,
    *,
    stop_after: int | Sequence[int],
    world_size: int | Sequence[int] = 1,
    epoch: int | None = None,
    expected: Iterable[Any] | None = None,
    pads: int = 0,
) -> Resumed:
    """Read, checkpoint, resume and check that nothing is lost or repeated (module doc).

    Args:
        make_dataset: a fresh dataset (made once per rank and stage, with ``RANK`` /
            ``WORLD_SIZE`` set).
        how: how a pass is read and checkpointed (:func:`plain`, :func:`stateful`,
            :func:`direct`, or a test's own :class:`Checkpoints`).
        stop_after: batches (samples with :func:`direct`) each rank takes before the
            checkpoint; a list: one checkpoint after another, each resumed from the one before.
        world_size: the ranks of each stage: one for all, or one per checkpoint and one more
            for the resumed job that reads to the end.
        epoch: ``set_epoch(epoch)`` on the first stage's datasets (None: as made).
        expected: the epoch's ids, in any order; None: a fresh dataset's whole epoch, read
            through ``how.open`` by one rank.
        pads: samples the job may read twice (ranks padded to equal counts); 0: none.

    Raises:
        AssertionError: a sample lost, one repeated beyond ``pads``, one not of the epoch, or
            (a per-job checkpoint) ranks that saved different checkpoints.
    """
    stops = [stop_after] if isinstance(stop_after, int) else list(stop_after)
    sizes = [world_size] * (len(stops) + 1) if isinstance(world_size, int) else list(world_size)
    if len(sizes) != len(stops) + 1:
        raise ValueError(
            f"world_size={world_size!r}: give one, or {len(stops) + 1} (each checkpoint's and the resume's)"
        )
    run = Resumed()
    states: list[Any] | None = None
    for stage, (stop, ranks) in enumerate(zip(stops, sizes)):
        taken, kept, saved = [], [], []
        for rank in range(ranks):
            with as_rank(rank, ranks):
                dataset = make_dataset()
                if states is None:
                    if epoch is not None:
                        dataset.set_epoch(epoch)
                    loader = how.open(dataset)
                else:
                    loader = how.resume(dataset, _state_for(how, states, rank, sizes[stage - 1], ranks))
                ids, batches, state = _take(how, loader, dataset, stop)
            taken.append(ids)
            kept.append(batches)
            saved.append(state)
            run.opened.append(loader)
        if how.per_job:
            assert all(state == saved[0] for state in saved), f"the ranks of checkpoint {stage} saved different states"
        run.before.append(taken)
        run.batches_before.append(kept)
        run.states.append(saved)
        states = saved
    ranks = sizes[-1]
    for rank in range(ranks):
        with as_rank(rank, ranks):
            dataset = make_dataset()
            loader = how.resume(dataset, _state_for(how, states, rank, sizes[-2], ranks))
            run.lengths.append(_length(dataset))
            run.epochs.append(getattr(dataset, "epoch", None))
            batches = [how.keep(batch) for batch in loader]
        run.after.append([i for batch in batches for i in how.ids(batch)])
        run.batches_after.append(batches)
        run.datasets.append(dataset)
        run.loaders.append(loader)
    if expected is None:
        expected = whole_epoch(make_dataset, how, epoch)
    assert_one_epoch(run.taken + run.rest, expected, pads=pads)
    return run


def checkpoint_after(how: Checkpoints, dataset: Any, batches: int) -> tuple[list[Any], Any]:
    """The ids of ``batches`` batches taken from a fresh pass of ``dataset``, and the
    checkpoint after them (for a test that checks a checkpoint itself, not a resume)."""
    ids, _, state = _take(how, how.open(dataset), dataset, batches)
    return ids, state


def whole_epoch(make_dataset: Callable[[], Any], how: Checkpoints, epoch: int | None = None) -> list[Any]:
    """The ids of a fresh dataset's whole epoch (``epoch``: set first), read by one rank
    (``RANK`` / ``WORLD_SIZE`` of a test put aside meanwhile)."""
    with as_rank(0, 1):
        dataset = make_dataset()
        if epoch is not None:
            dataset.set_epoch(epoch)
        return [i for batch in how.open(dataset) for i in how.ids(how.keep(batch))]


def assert_one_epoch(got: Iterable[Any], expected: Iterable[Any], *, pads: int = 0) -> None:
    """``got`` holds every id of ``expected`` as often (a sample repeated by the epoch
    itself, a mixture's ``repeat=``, as often again), and at most ``pads`` more of them."""
    want, have = collections.Counter(expected), collections.Counter(got)
    lost, extra = want - have, have - want
    assert not lost, f"{sum(lost.values())} samples lost, e.g. {sorted(lost)[:5]}"
    assert set(extra) <= set(want), f"samples not of the epoch: {sorted(set(extra) - set(want))[:5]}"
    assert sum(extra.values()) <= pads, (
        f"{sum(extra.values())} samples read again (at most {pads} allowed), e.g. {sorted(extra)[:5]}"
    )


@contextmanager
def as_rank(rank: int, world_size: int) -> Iterator[None]:
    """``RANK`` / ``WORLD_SIZE`` set as torchrun sets them (DataLoader workers inherit them),
    the environment's own restored after."""
    saved = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _take(how: Checkpoints, loader: Iterable[Any], dataset: Any, stop: int) -> tuple[list[Any], list[Any], Any]:
    """``stop`` batches of a fresh iterator of ``loader``, and the checkpoint saved while it is
    still open (as a training loop saves between steps); the iterator is dropped after."""
    it = iter(loader)
    batches = [how.keep(next(it)) for _ in range(stop)]
    ids = [i for batch in batches for i in how.ids(batch)]
    state = how.save(loader, dataset, len(ids))
    del it
    return ids, batches, state


def _state_for(how: Checkpoints, states: list[Any], rank: int, saved_by: int, resumed_by: int) -> Any:
    """Rank ``rank``'s checkpoint: the job's (any rank's), or its own (same world size only)."""
    if how.per_job:
        return states[0]
    if saved_by != resumed_by:
        raise ValueError(
            f"checkpoints of each rank's own resume at the same world size, not {saved_by} -> {resumed_by}"
        )
    return states[rank]


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None
