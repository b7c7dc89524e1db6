"""Which part of a pack job this run is: :class:`Part`, given as ``--part I/N`` or read
from the launcher's environment (:func:`part_from_env`). A pack job's streams are dealt to
its parts; each part packs its own, so N machines (or a SLURM job array, or torchrun) pack one
dataset without talking to each other."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Part", "part_from_env"]


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` (0-based): this run packs every ``count``-th stream."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"part {self.index}/{self.count} must satisfy 0 <= I < N")

    @classmethod
    def parse(cls, text: str) -> Part:
        """``"1/4"`` -> ``Part(1, 4)``."""
        index, _, count = text.partition("/")
        try:
            return cls(int(index), int(count))
        except ValueError:
            raise ValueError(f"part {text!r} must be I/N with 0 <= I < N, e.g. 0/2") from None


def part_from_env() -> Part | None:
    """The pack part this process should write, from the environment, or None.

    ``RANK`` / ``WORLD_SIZE`` (torchrun, or any launcher that sets them) come first, then a
    job array's index and count (``SLURM_ARRAY_TASK_ID`` / ``SLURM_ARRAY_TASK_COUNT``).

    Raises:
        ValueError: the variables are not integers or are inconsistent.
    """
    for index_var, count_var in (("RANK", "WORLD_SIZE"), ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")):
        index, count = os.environ.get(index_var), os.environ.get(count_var)
        if index is not None and count is not None:
            try:
                return Part(int(index), int(count))
            except ValueError:
                raise ValueError(
                    f"{index_var}={index!r} / {count_var}={count!r} must be integers with 0 <= index < count"
                ) from None
    return None
