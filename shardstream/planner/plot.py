"""A :class:`~shardstream.planner.model.JobPlan` as a PNG: the first steps' throughput, and per
epoch the egress, requests and node-cache hit rate. Needs matplotlib (``pip install
'shardstream[plot]'``), imported only here."""

from __future__ import annotations

import os
from typing import Any

from ..errors import MissingDependencyError

__all__ = ["plot"]


def plot(job: Any, path: str | os.PathLike[str]) -> str:
    """Draw ``job`` (a JobPlan) into the PNG ``path``; returns the path written.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            "the plan's plot needs matplotlib: pip install 'shardstream[plot]' (or matplotlib)"
        ) from exc
    steps = job.timings["steps"]
    epochs = list(range(len(job.epoch_time_s)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot([s["time_s"] for s in steps], [s["samples_per_s"] for s in steps], marker=".")
    left.axhline(job.samples_per_s_per_epoch[0], color="grey", linestyle="--", label="epoch 0 steady")
    left.axvline(job.time_to_first_batch_s, color="tab:red", linestyle=":", label="first batch")
    left.set_xlabel("time since start (s)")
    left.set_ylabel("samples/s, whole job")
    left.set_title(f"first steps (bound by {job.bound_by_per_epoch[0]})")
    left.legend(loc="lower right")
    right.bar(epochs, [b / 1e9 for b in job.egress_bytes_per_epoch], 0.5, label="egress GB")
    right.set_xlabel("epoch")
    right.set_ylabel("egress (GB)")
    right.set_xticks(epochs)
    twin = right.twinx()
    twin.plot(epochs, [h * 100 for h in job.cache_hit_rate], color="tab:green", marker="o", label="cache hits %")
    twin.set_ylim(0, 105)
    twin.set_ylabel("node cache hits (%)")
    right.set_title("per epoch: egress and node-cache hits")
    lines = right.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    right.legend(lines[0] + more[0], lines[1] + more[1], loc="center right")
    fig.suptitle(
        f"shardstream plan: {job.samples_per_s:,.0f} samples/s, bound by {job.bound_by}, "
        f"first batch {job.time_to_first_batch_s:.2f} s"
    )
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)
    return os.fspath(path)
