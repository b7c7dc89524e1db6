"""A mixture's epoch schedule (:class:`MixtureSchedule`: :mod:`.mixture`, :mod:`.mixplan`),
and the one place that picks a schedule for a list of sources, a dataset being a mixture of
one (:func:`schedule_for`) and refuses what a mixture cannot do (:func:`refused`). No torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..config import OrderSettings
from ..tarstream import Batch
from .assign import NodeAffinity, WorkerSlot
from .engine import ReadingEngine, read_mixed
from .epochs import PassState
from .filerun import FileRun
from .mixplan import MIX_MODES, MixturePlan, MixWorkerPlan, real_plan
from .mixture import Coverage, CoverageBase, Selection, Source, epoch_counts, selection
from .plan import Segment, WorkerPlan
from .schedule import EpochSchedule, Schedule
from .shards import ShardSet

__all__ = ["MixtureSchedule", "refused", "schedule_for"]


def refused(
    sources: Sequence[Source] | None,
    *,
    epoch_samples: int | None,
    resampled: bool,
    shard_affinity: NodeAffinity | None,
) -> None:
    """The one place that refuses what a mixture (``sources``; None: one location) cannot
    do, before anything is read: ``epoch_samples`` sizes a mixture's epoch, ``resampled``
    reads one dataset endlessly, node affinity splits one dataset's shards by node.

    Raises:
        ValueError: such a combination, saying what to do instead.
    """
    if sources is None or _whole_one(sources, epoch_samples):
        if sources is None and epoch_samples is not None:
            raise ValueError(
                f"{epoch_samples=} sets the size of a mixture's epoch; pass a list of Source(...) to mix datasets"
            )
        return
    if resampled:
        raise ValueError("resampled=True reads one dataset endlessly; a mixture's epochs are exact, drop it")
    if shard_affinity is not None:
        raise ValueError(
            "shard_affinity='node' is not supported for a mixture yet: each source would need its own node "
            "shares; read the mixture without it (its node cache then holds what each epoch brings)"
        )


def _whole_one(sources: Sequence[Source], epoch_samples: int | None) -> bool:
    """A mixture of one source read whole once an epoch: read as that dataset."""
    return len(sources) == 1 and sources[0].rule() == {"repeat": 1.0} and epoch_samples is None


def schedule_for(
    sources: Sequence[Source] | None,
    shard_sets: Sequence[ShardSet],
    order: OrderSettings,
    *,
    epoch_samples: int | None = None,
    mix: str = "stratified",
    shard_affinity: NodeAffinity | None = None,
    resampled: bool = False,
    unit: str = "sample",
) -> Schedule:
    """The schedule of a mixture (``sources``, their ``shard_sets``), a dataset being a
    mixture of one (``sources`` None, one shard set): what :func:`refused` allows, then the
    plan that reads it: one source read whole once an epoch by the dataset plan
    (:class:`EpochSchedule`: its order and checkpoints are those of a dataset), any other
    mixture by the mixture plan (:class:`MixtureSchedule`). ``unit``: what it counts (an
    :class:`~.stages.ItemUnit`'s name), recorded in checkpoints unless ``"sample"``.

    Raises:
        ValueError: as :func:`refused`; node affinity without counts (bare shard URLs) or
            with ``resampled``; a bad mixture, naming the source.
    """
    refused(sources, epoch_samples=epoch_samples, resampled=resampled, shard_affinity=shard_affinity)
    if sources is None or _whole_one(sources, epoch_samples):
        shards = shard_sets[0]
        if shard_affinity is not None and (resampled or shards.sample_counts is None):
            raise ValueError(
                "shard_affinity='node' splits exact epochs by node: it needs an index (not bare shard URLs) "
                "and resampled=False"
            )
        schedule: Schedule = EpochSchedule(shards, order, shard_affinity=shard_affinity)
    else:
        schedule = MixtureSchedule(sources, shard_sets, order, epoch_samples=epoch_samples, mix=mix)
    schedule.unit = unit
    return schedule


class MixtureSchedule(Schedule):
    """The epoch schedule of a mixture of sources (:mod:`.mixture`, :mod:`.mixplan`): the same
    questions as :class:`EpochSchedule`, answered per source, and checkpoints that record the
    mixture and where each source's coverage stands.

    Args:
        sources: the mixture's sources.
        shard_sets: each source's shards (with sample counts).
        epoch_samples: the epoch's size (needed with ``weight=`` sources).
        mix: ``"stratified"`` or ``"random"`` interleaving of the sources.
        seed, shuffle, shuffle_buffer, max_open_shards, drop_last, batch_size: as
            :class:`EpochSchedule`.

    Raises:
        ValueError: a bad mixture (:func:`~.mixture.epoch_counts`), or a source without sample
            counts, naming the source.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        shard_sets: Sequence[ShardSet],
        order: OrderSettings | None = None,
        *,
        epoch_samples: int | None,
        mix: str,
        **settings: Any,
    ) -> None:
        if mix not in MIX_MODES:
            raise ValueError(f"{mix=} must be one of {', '.join(MIX_MODES)}")
        for src, shards in zip(sources, shard_sets):
            if shards.sample_counts is None:
                raise ValueError(
                    f"Source {src.label!r} has no index: a mixture needs every source's sample counts; write one with "
                    "`shardstream index` or pack it with `shardstream pack`"
                )
        names = [src.label for src in sources]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(
                f"two sources are named {', '.join(map(repr, twice))}: checkpoints and stats() tell sources by name; "
                "give each Source its own name="
            )
        self.sources = list(sources)
        self.source_counts = [np.asarray(s.sample_counts, np.int64) for s in shard_sets]
        self.source_starts = [np.concatenate([[0], np.cumsum(c)]) for c in self.source_counts]
        self.sizes = [int(c.sum()) for c in self.source_counts]
        self.epoch_samples = epoch_samples
        self.per_epoch = epoch_counts(self.sources, self.sizes, epoch_samples)
        self.mix = mix
        self._keep(None, sum(s.num_shards for s in shard_sets), order, **settings)
        self.num_samples = sum(self.per_epoch)
        self.coverage = [
            Coverage(counts, per_epoch=n % size, seed=self.seed, source=i, shuffle=self.shuffle, base=CoverageBase())
            for i, (counts, n, size) in enumerate(zip(self.source_counts, self.per_epoch, self.sizes))
        ]
        self._selections: dict[int, list[Selection]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_selections"] = {}  # O(shards) arrays a spawned worker remakes for its epoch
        return state

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(src.label for src in self.sources)

    @property
    def per_source(self) -> dict[str, int]:
        return dict(zip(self.names, self.per_epoch))

    @property
    def epoch_varies(self) -> bool:
        """With ``shuffle``, ``mix="random"``, or a source read in part (each epoch the next part)."""
        return self.shuffle or self.mix == "random" or any(n % size for n, size in zip(self.per_epoch, self.sizes))

    def selections(self, epoch: int) -> list[Selection]:
        """Each source's samples in ``epoch`` (kept for the two latest epochs, so DataLoader
        workers forked after ``set_epoch`` or ``len()`` inherit them)."""
        if epoch not in self._selections:
            self._selections[epoch] = [
                selection(counts, cov, copies=n // size, seed=self.seed, epoch=epoch, source=i, shuffle=self.shuffle)
                for i, (counts, cov, n, size) in enumerate(
                    zip(self.source_counts, self.coverage, self.per_epoch, self.sizes)
                )
            ]
            while len(self._selections) > 2:
                del self._selections[next(iter(self._selections))]
        return self._selections[epoch]

    def prepare(self, epoch: int, slot: WorkerSlot | None = None) -> None:
        self.selections(epoch)

    def plan(self, state: PassState, slot: WorkerSlot | None = None) -> MixturePlan:
        return MixturePlan(self.selections(state.epoch), mix=self.mix, **self._plan_args(state))

    def read_worker(
        self, mine: MixWorkerPlan, epoch: int, engines: Sequence[ReadingEngine], **read: Any
    ) -> Iterator[Batch | FileRun]:
        """Each source's part of ``mine`` read by its engine, interleaved as the plan says
        (file runs are not handed on: a mixture's batches mix sources)."""
        plans = self.real_plans(mine, epoch)
        return read_mixed(engines, plans, mine, names=self.names, fetch=read["fetch"], stats=read["stats"])

    def shard_ids(self, slot: WorkerSlot, epoch: int) -> list[int]:
        """Shard ids (the sources' shards laid end to end) ``slot`` reads in ``epoch``: each
        source's part of its piece of the plan, source after source, each in reading order."""
        mine, _ = self.worker_plan(self.plan(PassState(epoch, []), slot), slot)
        out: dict[int, None] = {}
        first = 0
        for plan, counts in zip(self.real_plans(mine, epoch), self.source_counts):
            for run in plan.runs:
                out.setdefault(first + run.shard)
            first += len(counts)
        return list(out)

    @property
    def whole_sources(self) -> bool:
        """Whether each source is read whole, once, every epoch (``repeat=1``): then the
        mixture's samples are its sources' samples laid end to end."""
        return all(n == size for n, size in zip(self.per_epoch, self.sizes))

    def real_plans(self, plan: MixWorkerPlan, epoch: int) -> list[WorkerPlan]:
        """Each source's part of ``plan`` over its real shards, to read."""
        return [
            real_plan(p, sel, starts)
            for p, sel, starts in zip(plan.sources, self.selections(epoch), self.source_starts)
        ]

    def consumed_state(self, state: PassState, slot: WorkerSlot, **kwargs: Any) -> dict[str, Any]:
        out = super().consumed_state(state, slot, **kwargs)
        after = PassState(state.epoch, out["segments"])
        out["epoch_done"] = self.rank_count(after, slot) == 0
        return out

    def _mixture_dict(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch_samples": self.epoch_samples,
            "mix": self.mix,
            "sources": [
                {
                    "name": src.label,
                    "num_samples": size,
                    "num_shards": len(counts),
                    "rule": src.rule(),
                    "samples_per_epoch": n,
                    "coverage": CoverageBase(epoch, cov.position(epoch), cov.cuts_before(epoch)).to_dict(),
                }
                for src, size, counts, n, cov in zip(
                    self.sources, self.sizes, self.source_counts, self.per_epoch, self.coverage
                )
            ],
        }

    def _state_dict(self, epoch: int, segments: list[Segment]) -> dict[str, Any]:
        out = super()._state_dict(epoch, segments)
        out["mixture"] = self._mixture_dict(epoch)
        return out

    def loaded_state(self, state: dict[str, Any]) -> PassState:
        """The pass a mixture's checkpoint resumes. The same mixture resumes where it stopped,
        each source's coverage where it stood; a changed one (a source added or removed, a
        rule or a size changed) only at an epoch's start, or after the checkpoint's epoch was
        read to its end: the new mixture applies from that epoch, and each source it kept
        continues its coverage.

        Raises:
            ValueError: not a shardstream state, not a mixture's, other shuffle settings, or a
                changed mixture in the middle of an epoch (each difference named).
        """
        epoch, segments = self._checked(state, {}, "with other settings")
        old = state.get("mixture")
        if not isinstance(old, dict):
            raise ValueError("the state was saved by a dataset of one source, not a mixture; construct the same")
        changes = _mixture_changes(old, self._mixture_dict(epoch))
        olds = {x["name"]: x for x in old["sources"]}
        if not changes:
            for cov, src in zip(self.coverage, self.sources):
                cov.base = CoverageBase.from_dict(olds[src.label]["coverage"])
                cov._cycle = None
            self._selections.clear()
            return PassState(epoch, segments)
        if segments and not state.get("epoch_done"):
            raise ValueError(
                f"the mixture changed ({'; '.join(changes)}) in the middle of epoch {epoch}; resume epoch {epoch} "
                "with the mixture it started with, or change the mixture from a checkpoint saved at an epoch's end"
            )
        start = epoch + 1 if segments else epoch
        for cov, src, size, counts in zip(self.coverage, self.sources, self.sizes, self.source_counts):
            was = olds.get(src.label)
            if was is None or (was["num_samples"], was["num_shards"]) != (size, len(counts)):
                cov.base = CoverageBase(start, 0, ())
            else:
                before = Coverage(
                    counts,
                    per_epoch=int(was["samples_per_epoch"]) % size,
                    seed=self.seed,
                    source=cov.source,
                    shuffle=self.shuffle,
                    base=CoverageBase.from_dict(was["coverage"]),
                )
                cov.base = CoverageBase(start, before.position(start), before.cuts_before(start))
            cov._cycle = None
        self._selections.clear()
        return PassState(start, [])


def _mixture_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two mixtures as checkpoints record them, in words."""
    out = []
    if old.get("epoch_samples") != new["epoch_samples"]:
        out.append(f"epoch_samples {old.get('epoch_samples')} -> {new['epoch_samples']}")
    if old.get("mix") != new["mix"]:
        out.append(f"mix {old.get('mix')!r} -> {new['mix']!r}")
    was = {x["name"]: x for x in old["sources"]}
    now = {x["name"]: x for x in new["sources"]}
    out += [f"source {name!r} removed" for name in was if name not in now]
    out += [f"source {name!r} added" for name in now if name not in was]
    for name in now.keys() & was.keys():
        a, b = was[name], now[name]
        for key in ("rule", "num_samples", "num_shards", "samples_per_epoch"):
            if a.get(key) != b[key]:
                out.append(f"source {name!r}: {key} {a.get(key)} -> {b[key]}")
    if not out and [x["name"] for x in old["sources"]] != [x["name"] for x in new["sources"]]:
        out.append("sources in another order")
    return out
