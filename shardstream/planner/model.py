"""The job model behind ``shardstream plan``: a training job's data-loading speed, egress,
requests and cost, predicted from the index alone, before the job runs.

The model runs the reader's own planning, not a copy of it, in these steps, each a module whose
docstring gives its formulas:

- :mod:`.settings`: ``plan()``'s keyword arguments, checked once, as one frozen
  :class:`~.settings.PlanSettings` (the epoch order's and the store's settings as the reader's
  :class:`~shardstream.config.OrderSettings` and :class:`~shardstream.config.StoreSettings`);
- :mod:`.opening`: the dataset's index (or each source's) opened as a rank opens it, its
  shards as arrays, the opening timed;
- :mod:`.figures`: the store's, the reader's and the node's figures, each given, probed or
  assumed;
- :mod:`.runs`: each epoch's runs for every rank's every worker, from the reader's schedule,
  dealt to lanes as the reader deals them, with the read-ahead the reader cuts for each lane;
  the bytes of a run;
- :mod:`.requests`: the count rule: index, table and ranged data GETs, and the bytes, run by
  run;
- :mod:`.cache`: each node's cache simulated in time order across epochs (the policy of
  :mod:`shardstream.storage.cache`), and the cache at which later epochs read nothing;
- :mod:`.speed`: each epoch's time per resource (step, network, requests, CPU, cache disk)
  and what bounds it;
- :mod:`.lanes`: start-up each epoch (workers, lanes opening, shard turns), the time to the
  first batch and the first steps;
- :mod:`.advice`: workers, read-ahead, shard size and cache size, and the warnings of a job
  too wide for its data;
- :mod:`.report`: the :class:`~.report.JobPlan` handed back, as JSON or a text table;
- :mod:`.job`: :func:`plan` and :func:`plan_counts`, which run these steps.

This module keeps the names it held before the steps had modules of their own.
"""

from __future__ import annotations

from .figures import (
    DEFAULT_CACHE_BANDWIDTH,
    DEFAULT_CLIENT_S,
    DEFAULT_CPU_S_PER_SAMPLE,
    DEFAULT_CPU_S_PER_SAMPLE_CACHED,
    DEFAULT_WORKER_START_S,
    STORE_DEFAULTS,
)
from .job import plan, plan_counts
from .report import BOUNDS, JobPlan
from .requests import gets
from .settings import PlanSettings

__all__ = [
    "BOUNDS",
    "DEFAULT_CACHE_BANDWIDTH",
    "DEFAULT_CLIENT_S",
    "DEFAULT_CPU_S_PER_SAMPLE",
    "DEFAULT_CPU_S_PER_SAMPLE_CACHED",
    "DEFAULT_WORKER_START_S",
    "STORE_DEFAULTS",
    "JobPlan",
    "PlanSettings",
    "gets",
    "plan",
    "plan_counts",
]
