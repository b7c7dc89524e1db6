"""Which part of a pack job this run is: :class:`Part`, given as ``--part I/N`` or read
from the launcher's environment (:func:`part_from_env`). A pack job's streams are dealt to
its parts; each part packs its own, so N machines (or a SLURM job array, or torchrun) pack one
dataset without talking to each other."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import slurm_array_env, torchrun_env

__all__ = ["Part", "part_and_workers", "part_from_env"]


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
            i, n = int(index), int(count)
        except ValueError:
            raise ValueError(f"part {text!r} must be I/N with 0 <= I < N, e.g. 0/2") from None
        if not 0 <= i < n:  # most often parts numbered from 1
            hint = f": parts count from 0, the {n} parts are 0/{n} to {n - 1}/{n}" if n > 0 else ", e.g. 0/2"
            raise ValueError(f"part {text!r} must be I/N with 0 <= I < N{hint}")
        return cls(i, n)


def part_from_env() -> Part | None:
    """The pack part this process should write, from the environment, or None.

    ``RANK`` / ``WORLD_SIZE`` (torchrun, or any launcher that sets them) come first, then a
    SLURM job array's task (``SLURM_ARRAY_TASK_ID`` / ``SLURM_ARRAY_TASK_COUNT``): its part is
    its place in the array, counted from ``SLURM_ARRAY_TASK_MIN`` in steps of
    ``SLURM_ARRAY_TASK_STEP`` (both set by SLURM), so ``--array=1-4`` packs parts 0 to 3 and
    ``--array=0-6:2`` parts 0 to 3 too; without them the part is the task ID.

    Raises:
        ValueError: the variables are not integers or are inconsistent, or the array has gaps
            (``--array=0,2,5``: give each task ``--part I/N``).
    """
    torchrun = torchrun_env()
    index, count = torchrun.rank, torchrun.world_size
    if index is not None and count is not None:
        try:
            i, n = int(index), int(count)
        except ValueError:
            i = n = 0
        if not 0 <= i < n:
            raise ValueError(f"RANK={index!r} / WORLD_SIZE={count!r} must be integers with 0 <= index < count")
        return Part(i, n)
    return _slurm_array_part()


def part_and_workers(part: Part | None, workers: int | None, *, ray: str | None, overwrite: bool) -> tuple[Part, int]:
    """The part a pack run packs and its workers (``pack``, ``pack_tokens``): with ``ray``, the
    whole pack (this process connects to the cluster, :func:`shardstream.packing.ray_run.connect`)
    and ``workers`` tasks, default the cluster's CPUs; else ``part`` (default
    :func:`part_from_env`, else the whole) and ``workers`` processes, default the CPU count.

    Raises:
        ValueError: a part of several with ``ray``; ``overwrite`` with several parts.
        ShardstreamError: ray is not installed, or no cluster answers at ``ray``.
    """
    if ray is not None:
        from .ray_run import cluster_cpus, connect

        if part is not None and part.count > 1:
            raise ValueError("ray= runs every part on the cluster; give no part")
        connect(None if ray == "auto" else ray)
        part, workers = Part(0, 1), workers or cluster_cpus()
    part = part or part_from_env() or Part(0, 1)
    if overwrite and part.count > 1:
        raise ValueError(
            "--overwrite with several parts would let one part wipe another's work; "
            "empty DEST first, then run the parts"
        )
    return part, workers or os.cpu_count() or 1


def _slurm_array_part() -> Part | None:
    slurm = slurm_array_env()
    task_id, count, bounds = slurm.task_id, slurm.task_count, slurm.bounds
    if task_id is None or count is None:
        return None
    names = f"SLURM_ARRAY_TASK_ID={task_id!r} / SLURM_ARRAY_TASK_COUNT={count!r}"
    try:
        i, n = int(task_id), int(count)
    except ValueError:
        raise ValueError(f"{names} must be integers with 0 <= index < count") from None
    if bounds["MIN"] is None:  # no range given: the task ID is the part
        if not 0 <= i < n:
            if n > 0:  # an array numbered from 1, or with gaps
                raise ValueError(
                    f"{names}: the part is the task ID, so the array's tasks must be numbered 0 to {n - 1} "
                    f"(#SBATCH --array=0-{n - 1}), or give --part I/N"
                )
            raise ValueError(f"{names} must be integers with 0 <= index < count")
        return Part(i, n)
    try:
        first, step = int(bounds["MIN"]), int(bounds["STEP"] or 1)
        last = first + (n - 1) * step if bounds["MAX"] is None else int(bounds["MAX"])
    except ValueError:
        given = ", ".join(f"SLURM_ARRAY_TASK_{k}={v!r}" for k, v in bounds.items() if v is not None)
        raise ValueError(f"{given} must be integers") from None
    spec = f"{first}-{last}" + (f":{step}" if step != 1 else "")
    if n < 1 or step < 1 or last != first + (n - 1) * step:
        raise ValueError(
            f"{names}: the array {spec} does not hold {n} evenly spaced tasks (an array with gaps, such as "
            "--array=0,2,5, has no part numbering): give each task --part I/N"
        )
    offset = i - first
    if offset % step or not 0 <= offset // step < n:
        raise ValueError(f"{names}: task {i} is not one of the array {spec}")
    return Part(offset // step, n)
