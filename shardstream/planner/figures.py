"""The figures the model runs on, each given (an argument of ``plan()``), probed
(``probe=True``: :mod:`.probe` measures it from this machine against the dataset's store) or
assumed (a default, listed in ``JobPlan.assumptions`` with why); an argument wins over the
probe, the probe over the default:

- the store's: ``latency_ms``, ``bandwidth_per_node``, ``bandwidth_per_stream``,
  ``request_rate_limit`` (defaults by kind of store, :data:`STORE_DEFAULTS`: S3 30 ms,
  1.25 GB/s, 100 MB/s, 5,500 GETs/s);
- the reader's CPU: ``cpu_s_per_sample`` (50 us), ``cpu_s_per_sample_cached`` (20 us, never
  above ``cpu_s_per_sample``), and ``store_cpu_s_per_byte``, a store's or proxy's CPU on the
  node (0; probed only);
- the node's: ``cache_bandwidth_per_node`` (2 GB/s), ``cores_per_node`` (given, or with the
  probe this machine's ``os.cpu_count()``; else a core for each worker);
- start-up: ``client_s`` (0.1 s; local files 0), ``worker_start_s`` (0.05 s), ``open_s``
  (``client_s + latency + index bytes / bandwidth_per_stream``).

:class:`Figures` holds their values in the units the model computes in.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .opening import Data
from .settings import PlanSettings

__all__ = [
    "DEFAULT_CACHE_BANDWIDTH",
    "DEFAULT_CLIENT_S",
    "DEFAULT_CPU_S_PER_SAMPLE",
    "DEFAULT_CPU_S_PER_SAMPLE_CACHED",
    "DEFAULT_WORKER_START_S",
    "STORE_DEFAULTS",
    "Figures",
    "figures_of",
]

# Figures used where a store's are neither given nor probed (listed in JobPlan.assumptions).
STORE_DEFAULTS: dict[str, dict[str, float | None]] = {
    "s3": {
        "latency_ms": 30.0,
        "bandwidth_per_node": 1.25e9,
        "bandwidth_per_stream": 100e6,
        "request_rate_limit": 5500.0,
    },
    "gs": {"latency_ms": 30.0, "bandwidth_per_node": 1.25e9, "bandwidth_per_stream": 100e6, "request_rate_limit": None},
    "az": {"latency_ms": 30.0, "bandwidth_per_node": 1.25e9, "bandwidth_per_stream": 100e6, "request_rate_limit": None},
    "http": {
        "latency_ms": 50.0,
        "bandwidth_per_node": 1.25e9,
        "bandwidth_per_stream": 100e6,
        "request_rate_limit": None,
    },
    "local": {"latency_ms": 0.1, "bandwidth_per_node": 2e9, "bandwidth_per_stream": 2e9, "request_rate_limit": None},
}
_WHY = {
    "latency_ms": "first-byte time of a GET (S3 in-region: tens of ms)",
    "bandwidth_per_node": "a node's link (10 Gb/s = 1.25 GB/s); a local disk: 2 GB/s",
    "bandwidth_per_stream": "one connection's throughput (S3: ~100 MB/s)",
    "request_rate_limit": "S3's 5,500 GET/s per prefix (AWS request-rate guidelines), one prefix",
    "cpu_s_per_sample": "reader CPU parsing one sample, no decode (measure with probe=True)",
    "cache_bandwidth_per_node": "a node's local NVMe disk reading cache entries",
    "cpu_s_per_sample_cached": "reader CPU parsing one sample from a node-cache file (measure with probe=True)",
    "client_s": "making a store client (aiobotocore's S3 client: ~0.1 s of CPU; local files: none)",
    "worker_start_s": "a DataLoader worker's fork and set-up (~0.05 s; measure with probe=True)",
    "open_s": "client_s + the index GET (latency + index bytes / bandwidth_per_stream)",
    "cores_per_node": "a core for each of the node's workers (give cores_per_node where they share fewer)",
    "store_cpu_s_per_byte": "a remote store takes no CPU of the node (a store or proxy on the node would)",
}
DEFAULT_CPU_S_PER_SAMPLE = 5e-5
DEFAULT_CPU_S_PER_SAMPLE_CACHED = 2e-5  # never above cpu_s_per_sample
DEFAULT_CACHE_BANDWIDTH = 2e9
DEFAULT_CLIENT_S = 0.1  # a remote store's client; 0 for local files
DEFAULT_WORKER_START_S = 0.05


def figures_of(
    store: str, s: PlanSettings, probed: dict[str, Any] | None, index_bytes: int
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """``JobPlan.figures`` (each figure's value and source: given, probed, assumed) and
    ``JobPlan.assumptions`` for a dataset in a store of kind ``store`` whose largest index is
    ``index_bytes`` long; an argument wins over the probe, the probe over the default."""
    defaults = STORE_DEFAULTS[store]
    probed = probed or {}
    figures: dict[str, dict[str, Any]] = {}
    assumptions = []
    table: dict[str, Any] = {**defaults, "cpu_s_per_sample": DEFAULT_CPU_S_PER_SAMPLE}
    table["cache_bandwidth_per_node"] = DEFAULT_CACHE_BANDWIDTH
    table["cpu_s_per_sample_cached"] = DEFAULT_CPU_S_PER_SAMPLE_CACHED
    table["client_s"] = 0.0 if store == "local" else DEFAULT_CLIENT_S
    table["worker_start_s"] = DEFAULT_WORKER_START_S
    table["open_s"] = None  # computed from the figures before it
    table["store_cpu_s_per_byte"] = 0.0
    for name, default in table.items():
        if name == "cpu_s_per_sample_cached" and default is not None:
            default = min(default, figures["cpu_s_per_sample"]["value"])
        if name == "open_s":
            lat_s = figures["latency_ms"]["value"] / 1e3
            default = figures["client_s"]["value"] + lat_s + index_bytes / figures["bandwidth_per_stream"]["value"]
        given = s.given(name)
        if given is not None:
            figures[name] = {"value": float(given), "source": "given"}
        elif probed.get(name) is not None:
            figures[name] = {"value": float(probed[name]), "source": "probed"}
        else:
            figures[name] = {"value": default, "source": "assumed"}
            if name in ("cache_bandwidth_per_node", "cpu_s_per_sample_cached") and not s.cache_bytes:
                continue
            if (name == "worker_start_s" and not s.workers) or name == "store_cpu_s_per_byte":
                continue
            assumptions.append({"name": name, "value": default, "why": _WHY[name] + f" [{store} default]"})
    if s.cores_per_node is not None:
        figures["cores_per_node"] = {"value": s.cores_per_node, "source": "given"}
    elif probed:
        figures["cores_per_node"] = {"value": os.cpu_count() or 1, "source": "probed"}
    else:
        figures["cores_per_node"] = {"value": None, "source": "assumed"}
        assumptions.append({"name": "cores_per_node", "value": None, "why": _WHY["cores_per_node"]})
    return figures, assumptions


@dataclass(frozen=True)
class Figures:
    """The figures' values as the model uses them (seconds, bytes/s, samples), made once per
    plan by :meth:`of`.

    Attributes:
        latency_s: first-byte time of a GET.
        bandwidth_per_node, bandwidth_per_stream, cache_bandwidth_per_node: bytes/s.
        request_rate_limit: GETs/s for the whole job (None: unlimited).
        cpu_s_per_sample, cpu_s_per_sample_cached: reader CPU a sample, from the store and
            from the node cache.
        client_s, worker_start_s, open_s: start-up seconds (``worker_start_s`` 0 without
            workers).
        cores_per_node: the node's cores (None: one per worker).
        store_cpu_s_per_byte: a store's CPU on the node per byte it serves.
        contention: how much the node's readers' CPU times stretch where they share fewer
            cores than processes (>= 1).
        cpu_bandwidth: bytes/s the node's cores can take in (each byte costs the reader's
            CPU and a local store's; unlimited without ``cores_per_node``).
    """

    latency_s: float
    bandwidth_per_node: float
    bandwidth_per_stream: float
    request_rate_limit: float | None
    cpu_s_per_sample: float
    cpu_s_per_sample_cached: float
    cache_bandwidth_per_node: float
    client_s: float
    worker_start_s: float
    open_s: float
    cores_per_node: float | None
    store_cpu_s_per_byte: float
    contention: float
    cpu_bandwidth: float

    @classmethod
    def of(cls, figures: dict[str, dict[str, Any]], s: PlanSettings, data: Data) -> Figures:
        """The values of ``figures`` (:func:`figures_of`) for the job ``s`` on ``data``."""
        value = {name: fig["value"] for name, fig in figures.items()}
        cores, cpu_s, store_cpu = value["cores_per_node"], value["cpu_s_per_sample"], value["store_cpu_s_per_byte"]
        # the node's readers share its cores: CPU times stretch by processes / cores where fewer
        contention = max(1.0, s.gpus_per_node * s.processes / cores) if cores else 1.0
        return cls(
            latency_s=value["latency_ms"] / 1e3,
            bandwidth_per_node=value["bandwidth_per_node"],
            bandwidth_per_stream=value["bandwidth_per_stream"],
            request_rate_limit=value["request_rate_limit"],
            cpu_s_per_sample=cpu_s,
            cpu_s_per_sample_cached=value["cpu_s_per_sample_cached"],
            cache_bandwidth_per_node=value["cache_bandwidth_per_node"],
            client_s=value["client_s"],
            worker_start_s=value["worker_start_s"] if s.workers else 0.0,
            open_s=value["open_s"],
            cores_per_node=cores,
            store_cpu_s_per_byte=store_cpu,
            contention=contention,
            cpu_bandwidth=cores / (cpu_s / data.bytes_per_sample + store_cpu) if cores else math.inf,
        )
