"""A :class:`~shardstream.planner.report.JobPlan` as a PNG: the first steps' throughput, and per
epoch the egress and node-cache hit rate; a panel with nothing to show (one step, no cache) is
left out (:func:`figure`). Needs matplotlib (``pip install 'shardstream[plot]'``), imported
only here."""

from __future__ import annotations

import os
from typing import Any

from ..errors import MissingDependencyError
from .report import SIZE_UNITS, duration

__all__ = ["figure", "plot"]


def plot(job: Any, path: str | os.PathLike[str]) -> str:
    """Draw ``job`` (a JobPlan) into the PNG ``path`` (:func:`figure`); returns the path written.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    plt = _pyplot()
    fig = figure(job)
    try:
        fig.savefig(os.fspath(path), dpi=100)
    finally:
        plt.close(fig)
    return os.fspath(path)


def figure(job: Any) -> Any:
    """``job`` (a JobPlan) as a matplotlib Figure (Agg backend), with a panel for each part
    of the plan that has something to show:

    - the first steps' throughput (whole job, samples/s) over time, where a rank's epoch has
      at least two steps; with one step a curve would be a lone point, so the panel is left
      out and a note under the figure gives that step's time instead;
    - per epoch, the egress as bars (one bar for one epoch; in the unit of the largest: KB,
      MB, GB, ...), and the node cache's hit rate (%) on a second axis where the plan has a
      node cache (a line from two epochs on, markers alone for one).

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    plt = _pyplot()
    steps = job.timings["steps"]
    epochs = list(range(len(job.epoch_time_s)))
    show_steps = len(steps) >= 2
    fig, axes = plt.subplots(1, 2 if show_steps else 1, figsize=(12 if show_steps else 7, 4.5), squeeze=False)
    panels = list(axes[0])
    notes = []
    if show_steps:
        left = panels.pop(0)
        left.plot([s["time_s"] for s in steps], [s["samples_per_s"] for s in steps], marker=".")
        left.axhline(job.samples_per_s_per_epoch[0], color="grey", linestyle="--", label="epoch 0 steady")
        left.axvline(job.time_to_first_batch_s, color="tab:red", linestyle=":", label="first batch")
        left.set_xlabel("time since start (s)")
        left.set_ylabel("samples/s, whole job")
        left.set_title(f"first steps (bound by {job.bound_by_per_epoch[0]})")
        left.legend(loc="lower right")
    elif steps:
        notes.append(f"one step per rank an epoch (done at {duration(steps[0]['time_s'])}): no step curve to draw")
    else:
        notes.append("no step: every rank's epoch is empty")
    right = panels[0]
    top = max(job.egress_bytes_per_epoch, default=0)
    factor, unit = next(((f, u) for f, u in SIZE_UNITS if top >= f), (1.0, "B"))
    right.bar(epochs, [b / factor for b in job.egress_bytes_per_epoch], 0.5, label=f"egress {unit}")
    right.set_xlabel("epoch")
    right.set_ylabel(f"egress ({unit})")
    right.set_xticks(epochs)
    right.set_xlim(-0.75, len(epochs) - 0.25)
    handles, labels = right.get_legend_handles_labels()
    if job.inputs.get("cache_bytes"):
        twin = right.twinx()
        style = {"marker": "o"} if len(epochs) >= 2 else {"marker": "o", "linestyle": "none"}
        twin.plot(epochs, [h * 100 for h in job.cache_hit_rate], color="tab:green", label="cache hits %", **style)
        twin.set_ylim(0, 105)
        twin.set_ylabel("node cache hits (%)")
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
        right.set_title("per epoch: egress and node-cache hits")
    else:
        right.set_title("per epoch: egress (no node cache)")
    right.legend(handles, labels, loc="center right")
    fig.suptitle(
        f"shardstream plan: {job.samples_per_s:,.0f} samples/s, bound by {job.bound_by}, "
        f"first batch {job.time_to_first_batch_s:.2f} s"
    )
    if notes:
        fig.text(0.5, 0.01, "; ".join(notes), ha="center", va="bottom", fontsize=9, color="dimgrey")
    fig.tight_layout(rect=(0, 0.05 if notes else 0, 1, 1))
    return fig


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            "the plan's plot needs matplotlib: pip install 'shardstream[plot]' (or matplotlib)"
        ) from exc
    return plt
