"""A checkpoint of an exact epoch, as few numbers: its :class:`Segment` s (one per shape of
the job the epoch was read with, each with what its readers delivered), read back with every
value checked, and which samples a rank's DataLoader delivered from its count
(:func:`consumed_per_worker`). No torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Segment", "consumed_per_worker"]


@dataclass(frozen=True)
class Segment:
    """One stretch of an epoch run with one job shape, and how far each rank got.

    ``samples_consumed`` is per rank (all ranks of a DDP job consume the same count);
    ``worker_yielded`` instead gives each worker's count (as a StatefulDataLoader worker
    reports it), for a resume of the same shape only. ``batch_size`` is the DataLoader's
    (None: unbatched, one sample at a time); ``split_batch_size`` the one the workers' pieces
    were cut by (:func:`split_workers`; the dataset's ``batch_size``).
    """

    world_size: int
    num_workers: int
    batch_size: int | None = None
    samples_consumed: int | None = None
    worker_yielded: tuple[tuple[int, int], ...] = ()  # ((worker_id, samples yielded), ...)
    split_batch_size: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "samples_consumed": self.samples_consumed,
            "worker_yielded": [list(x) for x in self.worker_yielded],
            "split_batch_size": self.split_batch_size,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Segment:
        """The segment of a checkpoint's ``to_dict()`` (user input: each field's type is checked).

        Raises:
            KeyError: ``world_size`` or ``num_workers`` is missing.
            ValueError: a field is not an int (or None, where it may be), naming it.
        """
        return cls(
            world_size=_int(d, "world_size"),
            num_workers=_int(d, "num_workers"),
            batch_size=_optional_int(d, "batch_size"),
            samples_consumed=_optional_int(d, "samples_consumed"),
            worker_yielded=_int_pairs(d, "worker_yielded"),
            split_batch_size=_optional_int(d, "split_batch_size"),
        )


def _as_int(value: object, key: str) -> int:
    """``value``, a checkpoint's ``key`` field, as an int; ValueError naming the field if it is none."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise ValueError(f"checkpoint segment field {key!r} is {value!r}, not an int: load a state_dict() the dataset made")


def _int(d: dict[str, object], key: str) -> int:
    return _as_int(d[key], key)


def _optional_int(d: dict[str, object], key: str) -> int | None:
    value = d.get(key)
    return None if value is None else _as_int(value, key)


def _int_pairs(d: dict[str, object], key: str) -> tuple[tuple[int, int], ...]:
    """``d[key]``'s ``[[a, b], ...]`` as int pairs (none where it is missing or empty)."""
    value = d.get(key) or ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(x, (list, tuple)) and len(x) == 2 for x in value):
        raise ValueError(f"checkpoint segment field {key!r} is {value!r}, not a list of [int, int] pairs")
    return tuple((_as_int(a, key), _as_int(b, key)) for a, b in value)


def consumed_per_worker(lengths: Sequence[int], batch_size: int | None, samples_consumed: int) -> list[int]:
    """How many samples each DataLoader worker had delivered when the rank had consumed
    ``samples_consumed``: batches come in order, round-robin over the workers that still have
    data, each worker's last batch possibly short.

    Raises:
        ValueError: ``samples_consumed`` is negative or more than the workers hold.
    """
    total = sum(lengths)
    if not 0 <= samples_consumed <= total:
        raise ValueError(
            f"samples_consumed={samples_consumed} must be in [0, {total}] (the samples this rank has this epoch)"
        )
    size = batch_size or 1
    done = [0] * len(lengths)
    left = samples_consumed
    rounds = max((math.ceil(n / size) for n in lengths), default=0)
    full_rounds = min(left // max(1, size * len(lengths)), min((n // size for n in lengths), default=0))
    for w in range(len(lengths)):  # whole rounds in which every worker gives a full batch
        done[w] = full_rounds * size
    left -= full_rounds * size * len(lengths)
    for _ in range(full_rounds, rounds):
        for w, n in enumerate(lengths):
            if left == 0:
                return done
            take = min(size, n - done[w], left)
            if take > 0:
                done[w] += take
                left -= take
    return done
