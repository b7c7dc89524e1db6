"""``shardstream plan``: a training job's data-loading speed, egress, requests and cost,
predicted from the dataset's index before the job runs (:mod:`.model` maps the model's
modules; :func:`plan` and :func:`plan_counts` live in :mod:`.job`); ``probe=True`` measures
the store from this machine (:mod:`.probe`); :func:`plot` draws a plan (:mod:`.chart`,
matplotlib, imported only there). No torch at import."""

from .figures import STORE_DEFAULTS
from .job import plan, plan_counts
from .report import BOUNDS, JobPlan
from .requests import gets

__all__ = ["BOUNDS", "STORE_DEFAULTS", "JobPlan", "gets", "plan", "plan_counts", "plot", "selftest_scale"]


def plot(job: JobPlan, path: str) -> str:
    """:func:`.chart.plot`: ``job`` as a PNG at ``path`` (needs matplotlib).

    The drawing lives in :mod:`.chart`, not in a submodule named ``plot``: importing that
    would rebind this package's ``plot`` to the module, so a second call would fail."""
    from .chart import plot as draw

    return draw(job, path)


def selftest_scale(
    shards: int = 1_000_000, samples: int = 10_000_000_000, nodes: int = 128, gpus_per_node: int = 8, workers: int = 8
) -> tuple[JobPlan, float]:
    """Plan a synthetic dataset of ``shards`` shards and ``samples`` samples (about 100 KB each)
    for ``nodes x gpus_per_node`` ranks of ``workers`` workers; returns the plan and the
    seconds it took (``python -m shardstream.planner --selftest-scale``)."""
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    counts = np.full(shards, samples // shards, np.int64)
    counts[: samples - int(counts.sum())] += 1
    nbytes = counts * 100_000 + rng.integers(0, 50_000, shards)
    began = time.perf_counter()
    job = plan_counts(
        counts,
        nbytes,
        store="s3",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        workers=workers,
        batch_size=256,
        samples_per_s_per_gpu=2000.0,
        epochs=2,
    )
    return job, time.perf_counter() - began
