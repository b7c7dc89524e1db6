"""The planner's settings: :func:`~shardstream.planner.job.plan`'s keyword arguments, checked
once, as one frozen value (:class:`PlanSettings`) passed whole. The epoch order's settings are
the reader's own :class:`~shardstream.config.OrderSettings` and the store's its
:class:`~shardstream.config.StoreSettings`; the closed choices are the
:mod:`shardstream.config` Literals."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..config import Affinity, FetchConfig, MixMode, OrderSettings, StoreSettings

__all__ = ["DEFAULTS", "GIVEN_FIGURES", "PlanSettings"]

# plan()'s keyword arguments and their defaults, in its order (plan_counts fills in from here;
# JobPlan.inputs echoes them in this order).
DEFAULTS: dict[str, Any] = {
    "nodes": 1,
    "gpus_per_node": 1,
    "workers": 2,
    "batch_size": 64,
    "step_time_s": None,
    "samples_per_s_per_gpu": None,
    "cache_bytes": 0,
    "shuffle": True,
    "seed": 0,
    "shuffle_buffer": 1000,
    "max_open_shards": 4,
    "drop_last": False,
    "shard_affinity": None,
    "epochs": 2,
    "latency_ms": None,
    "bandwidth_per_node": None,
    "request_rate_limit": None,
    "price_per_gb": None,
    "price_per_1000_gets": None,
    "cpu_s_per_sample": None,
    "probe": False,
    "s3": None,
    "fetch": None,
    "bandwidth_per_stream": None,
    "cache_bandwidth_per_node": None,
    "persistent_workers": False,
    "epoch_samples": None,
    "mix": "stratified",
    "decode": None,
    "cpu_s_per_sample_cached": None,
    "open_s": None,
    "client_s": None,
    "worker_start_s": None,
    "cores_per_node": None,
}
_ORDER = tuple(f.name for f in fields(OrderSettings))  # seed, shuffle, ..., batch_size
_STORE = ("s3", "fetch")

# The figures an argument may give (None: probed or assumed; :mod:`.figures`).
GIVEN_FIGURES = (
    "latency_ms",
    "bandwidth_per_node",
    "bandwidth_per_stream",
    "request_rate_limit",
    "cpu_s_per_sample",
    "cache_bandwidth_per_node",
    "cpu_s_per_sample_cached",
    "client_s",
    "worker_start_s",
    "open_s",
    "cores_per_node",
)
_POSITIVE = (  # numbers > 0 or None
    "step_time_s",
    "samples_per_s_per_gpu",
    "latency_ms",
    "bandwidth_per_node",
    "request_rate_limit",
    "cpu_s_per_sample",
    "bandwidth_per_stream",
    "cache_bandwidth_per_node",
    "cpu_s_per_sample_cached",
)


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """A job to plan, as :func:`~shardstream.planner.job.plan` takes it (its Args), checked:
    made by :meth:`of` from its keyword arguments, never edited.

    Attributes:
        nodes, gpus_per_node, workers, epochs, persistent_workers: the job's shape.
        order: the epoch order's settings (``batch_size``: the DataLoader's, never None here).
        shard_affinity: None or ``"node"``.
        store: the S3 endpoint and the readers' FetchConfig (``s3``, ``fetch``; no node cache
            here: ``cache_bytes`` is the planned one).
        cache_bytes: the node cache per node, bytes (0: none).
        step_time_s, samples_per_s_per_gpu: the consumer's pace, one of them or neither.
        latency_ms, bandwidth_per_node, bandwidth_per_stream, request_rate_limit,
            cpu_s_per_sample, cache_bandwidth_per_node, cpu_s_per_sample_cached, client_s,
            worker_start_s, open_s, cores_per_node: the figures given, in the units their
            names say (None: probed or assumed; :data:`GIVEN_FIGURES`, :mod:`.figures`).
        price_per_gb, price_per_1000_gets: prices, dollars (None: not given).
        epoch_samples, mix: a mixture's (``mix`` is checked by the mixture's schedule; a
            plain dataset leaves it unread).
        probe, decode: measure the store from here, and what the probe decodes with.
    """

    nodes: int
    gpus_per_node: int
    workers: int
    epochs: int
    persistent_workers: bool
    order: OrderSettings
    shard_affinity: Affinity | None
    store: StoreSettings
    cache_bytes: int
    step_time_s: float | None
    samples_per_s_per_gpu: float | None
    latency_ms: float | None
    bandwidth_per_node: float | None
    bandwidth_per_stream: float | None
    request_rate_limit: float | None
    cpu_s_per_sample: float | None
    cache_bandwidth_per_node: float | None
    cpu_s_per_sample_cached: float | None
    client_s: float | None
    worker_start_s: float | None
    open_s: float | None
    cores_per_node: int | None
    price_per_gb: float | None
    price_per_1000_gets: float | None
    epoch_samples: int | None
    mix: MixMode
    probe: bool
    decode: Any

    @classmethod
    def of(cls, **given: Any) -> PlanSettings:
        """The settings of ``given`` (plan()'s keyword arguments; those left out take their
        defaults, :data:`DEFAULTS`), checked.

        Raises:
            ValueError: an unknown argument, or one out of range (the first, named, with what
                to pass).
        """
        unknown = sorted(set(given) - set(DEFAULTS) - {"dataset"})  # plan_counts(dataset=...): not read
        if unknown:
            raise ValueError(f"unknown argument(s) {', '.join(unknown)}; plan() takes {', '.join(DEFAULTS)}")
        raw = {k: given.get(k, v) for k, v in DEFAULTS.items()}
        _check_shape(raw)
        _check_figures(raw)
        rest = {k: v for k, v in raw.items() if k not in _ORDER and k not in _STORE}
        return cls(
            order=OrderSettings(**{k: raw[k] for k in _ORDER}),
            store=StoreSettings(s3=raw["s3"], fetch=raw["fetch"]),
            **rest,
        )

    @property
    def batch_size(self) -> int:
        """The DataLoader's batch size (``order.batch_size``)."""
        assert self.order.batch_size is not None  # internal invariant: of() always gives one
        return self.order.batch_size

    @property
    def world_size(self) -> int:
        """Ranks: ``nodes x gpus_per_node``."""
        return self.nodes * self.gpus_per_node

    @property
    def processes(self) -> int:
        """Reading processes per rank: its workers, or the rank itself with ``workers=0``."""
        return max(1, self.workers)

    @property
    def persistent(self) -> bool:
        """Whether a reading process lives on from epoch to epoch (``persistent_workers``, or
        ``workers=0``: the rank's own)."""
        return bool(self.persistent_workers or self.workers == 0)

    @property
    def fetch(self) -> FetchConfig:
        """The readers' FetchConfig (the default where none was given)."""
        return self.store.fetch_or_default

    @property
    def pace(self) -> float | None:
        """Samples/s one GPU consumes: ``samples_per_s_per_gpu``, or ``batch_size /
        step_time_s``; None: unlimited."""
        if self.samples_per_s_per_gpu is not None:
            return float(self.samples_per_s_per_gpu)
        if self.step_time_s is not None:
            return self.batch_size / self.step_time_s
        return None

    def given(self, figure: str) -> float | None:
        """The figure named ``figure`` as an argument gave it (None: not given, or no argument
        gives it)."""
        value: float | None = getattr(self, figure) if figure in GIVEN_FIGURES else None
        return value

    def inputs(self) -> dict[str, Any]:
        """plan()'s arguments as given, in its order, ``decode`` left out (``JobPlan.inputs``
        echoes them)."""
        out = {}
        for name in DEFAULTS:
            if name != "decode":
                holder = self.order if name in _ORDER else self.store if name in _STORE else self
                out[name] = getattr(holder, name)
        return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_shape(raw: Mapping[str, Any]) -> None:
    """The job's shape, its order and its cache in ``raw``: ValueError naming the first bad one."""
    for name, low in (("nodes", 1), ("gpus_per_node", 1), ("workers", 0), ("batch_size", 1), ("epochs", 1)):
        value = raw[name]
        if not _is_int(value) or value < low:
            raise ValueError(f"{name}={value!r} must be an int >= {low}")
    for name in ("shuffle_buffer", "seed"):
        if not _is_int(raw[name]) or (name == "shuffle_buffer" and raw[name] < 0):
            raise ValueError(f"{name}={raw[name]!r} must be an int" + (" >= 0" if name == "shuffle_buffer" else ""))
    if not isinstance(raw["max_open_shards"], int) or raw["max_open_shards"] < 1:
        raise ValueError(f"max_open_shards={raw['max_open_shards']!r} must be an int >= 1")
    if not _is_int(raw["cache_bytes"]) or raw["cache_bytes"] < 0:
        raise ValueError(f"cache_bytes={raw['cache_bytes']!r} must be an int >= 0 (bytes per node; 0: no cache)")
    if raw["step_time_s"] is not None and raw["samples_per_s_per_gpu"] is not None:
        raise ValueError("give step_time_s or samples_per_s_per_gpu, not both (the consumer's pace, one way)")


def _check_figures(raw: Mapping[str, Any]) -> None:
    """The figures, prices, affinity and FetchConfig in ``raw``: ValueError naming the first bad one."""
    for name in _POSITIVE:
        value = raw[name]
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ValueError(f"{name}={value!r} must be a number > 0, or None (the default figure)")
    for name in ("open_s", "client_s", "worker_start_s"):
        value = raw[name]
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"{name}={value!r} must be a number >= 0 (seconds), or None (the default figure)")
    cores = raw["cores_per_node"]
    if cores is not None and (not _is_int(cores) or cores < 1):
        raise ValueError(f"cores_per_node={cores!r} must be an int >= 1, or None")
    if raw["latency_ms"] is not None and raw["latency_ms"] <= 0:
        raise ValueError(f"latency_ms={raw['latency_ms']!r} must be > 0")
    for name in ("price_per_gb", "price_per_1000_gets"):
        value = raw[name]
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"{name}={value!r} must be a number >= 0 (dollars), or None")
    if raw["shard_affinity"] not in (None, "node"):
        raise ValueError(f"shard_affinity={raw['shard_affinity']!r} must be None or 'node'")
    if raw["fetch"] is not None and not isinstance(raw["fetch"], FetchConfig):
        raise ValueError(f"fetch={raw['fetch']!r} must be a shardstream.FetchConfig or None")
