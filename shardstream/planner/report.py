"""What the planner hands back: :class:`JobPlan`, JSON-ready (:meth:`JobPlan.to_dict`) or as a
text table (:meth:`JobPlan.table`), and the words and units the table and the advice put its
numbers in (bytes, rates and durations at a human scale, never scientific notation)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BOUNDS", "SIZE_UNITS", "JobPlan", "count_text", "duration", "echo", "rate", "sig", "size"]

BOUNDS = ("network", "requests", "cpu", "cache", "step")


@dataclass
class JobPlan:
    """What :func:`~shardstream.planner.job.plan` predicts for a job (the doc of
    :mod:`shardstream.planner.model`). Sizes are bytes, times seconds, rates per second; lists
    have one entry per epoch. :meth:`to_dict` is JSON-ready; ``str()`` is :meth:`table`.

    Attributes:
        inputs: the arguments, echoed.
        figures: the store figures used (latency_ms, bandwidth_per_node, bandwidth_per_stream,
            request_rate_limit, cpu_s_per_sample, cache_bandwidth_per_node), each with where
            it came from ("given", "probed" or "assumed").
        assumptions: the figures assumed, with the default and why.
        time_to_first_batch_s: until the first batch of a worker is ready (:mod:`.lanes`).
        samples_per_s: the whole job's steady samples/s in the slowest epoch.
        input_bound: that epoch is bound by anything but the step.
        bound_by: "network", "requests", "cpu", "cache" or "step".
        egress_bytes_per_epoch: shard bytes read from the store.
        egress_detail: per epoch, the bytes of shards (``data``), sample tables and index.bin.
        requests_per_epoch: requests to the store (index GETs in the first epoch);
            ``requests_detail``: per epoch, of the index, tables and data.
        cache_hit_rate: hits / accesses of the node caches (0 without a cache).
        min_cache_bytes_per_node: the node cache at which epochs after the first read
            nothing from the store (``min_cache_note`` says what it means here).
        cost_per_epoch: egress and request prices, per epoch (None without prices).
        recommendations: ``{"setting", "value", "reason"}`` dicts.
        notes: what the figures assume, and the warnings, in words.
        warnings: what will go wrong with this job's shape, each with what to do: an epoch
            of fewer samples than one global batch (``world_size x batch_size``), a rank
            given fewer samples than one batch an epoch (also in ``notes``).
        timings: ``steps`` (first steps: step, time_s, samples_per_s), ``cache`` (per epoch:
            bytes held per node, mean and max, and the hit rate), ``epochs`` (each epoch's
            time per bound).
    """

    inputs: dict[str, Any]
    figures: dict[str, dict[str, Any]]
    assumptions: list[dict[str, Any]]
    dataset: dict[str, Any]
    world_size: int
    samples_per_epoch: int
    time_to_first_batch_s: float
    samples_per_s: float
    input_bound: bool
    bound_by: str
    samples_per_s_per_epoch: list[float]
    bound_by_per_epoch: list[str]
    epoch_time_s: list[float]
    job_time_s: float
    egress_bytes_per_epoch: list[int]
    egress_detail: list[dict[str, int]]
    requests_per_epoch: list[int]
    requests_detail: list[dict[str, int]]
    cache_hit_rate: list[float]
    min_cache_bytes_per_node: int
    min_cache_note: str
    cost_per_epoch: list[float] | None
    recommendations: list[dict[str, Any]]
    timings: dict[str, Any]
    byte_ranges: str
    probe: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    compute_s: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every attribute, JSON-ready (numbers, strings, lists, dicts)."""
        return _plain({k: getattr(self, k) for k in self.__dataclass_fields__})

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def table(self) -> str:
        """The plan as a readable text table."""
        d = self.dataset
        rows = [
            f"dataset       {d['num_shards']:,} shards, {d['num_samples']:,} samples, {size(d['bytes'])}"
            f" ({d['store']})",
            f"job           {self.inputs['nodes']} nodes x {self.inputs['gpus_per_node']} GPUs x "
            f"{self.inputs['workers']} workers, batch {self.inputs['batch_size']}, "
            f"{self.samples_per_epoch:,} samples/epoch",
            f"first batch   {duration(self.time_to_first_batch_s)}",
            f"speed         {self.samples_per_s:,.0f} samples/s (whole job), bound by {self.bound_by}"
            + (" (input-bound)" if self.input_bound else " (the GPUs set the pace)"),
            f"job time      {duration(self.job_time_s)} for {len(self.epoch_time_s)} epochs",
            f"min cache     {size(self.min_cache_bytes_per_node)} per node ({self.min_cache_note})",
            "",
            f"{'epoch':>5}  {'egress':>10}  {'requests':>12}  {'cache hits':>10}  {'samples/s':>12}  {'bound':>8}"
            f"  {'time':>9}" + ("  cost" if self.cost_per_epoch is not None else ""),
        ]
        rows += [self._epoch_row(e) for e in range(len(self.epoch_time_s))]
        rows += ["", "figures:"]
        for name, fig in self.figures.items():
            rows.append(f"  {name:<26} {_figure(name, fig['value']):>16}  ({fig['source']})")
        if self.recommendations:
            rows += ["", "recommendations:"]
            rows += [
                f"  {r['setting']} = {_setting_value(r['setting'], r['value'])}: {r['reason']}"
                for r in self.recommendations
            ]
        if self.notes:
            rows += ["", "notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(rows)

    def _epoch_row(self, e: int) -> str:
        """Epoch ``e``'s row of the table."""
        row = (
            f"{e:>5}  {size(self.egress_bytes_per_epoch[e]):>10}  {self.requests_per_epoch[e]:>12,}  "
            f"{self.cache_hit_rate[e]:>10.1%}  {self.samples_per_s_per_epoch[e]:>12,.0f}  "
            f"{self.bound_by_per_epoch[e]:>8}  {duration(self.epoch_time_s[e]):>9}"
        )
        if self.cost_per_epoch is not None:
            cost = self.cost_per_epoch[e]
            row += f"  ${cost:,.2f}" if cost >= 0.01 or cost == 0 else f"  ${sig(cost, 2)}"
        return row

    def __str__(self) -> str:
        return self.table()


def _plain(value: Any) -> Any:
    """``value`` with numpy numbers, tuples and dataclasses made JSON-ready."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def echo(value: Any) -> Any:
    """An argument as ``JobPlan.inputs`` echoes it: plain values as they are, others by repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def size(n: float) -> str:
    """Bytes at a human scale: ``"512 B"``, ``"16.8 MB"``, ``"1.0 PB"`` (powers of 1,000)."""
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


SIZE_UNITS = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1.0, "B"))
_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))


def sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits in plain notation, never scientific, with
    thousands separators and at least one decimal under 10: ``"2.0"``, ``"1.25"``, ``"50"``,
    ``"1,500"``, ``"0.000012"`` (two digits)."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    x = float(f"{x:.{digits}g}")
    places = max(0, min(15, digits - 1 - math.floor(math.log10(abs(x)))))
    text = f"{x:,.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text + ".0" if abs(x) < 10 and "." not in text else text


def _scaled(x: float, units: tuple[tuple[float, str], ...], one: str) -> str:
    """``x`` in the largest of ``units`` (``(factor, name)``, largest first) it reaches, to 3
    significant digits; 0 in the unit ``one``."""
    if x == 0:
        return f"0 {one}"
    x = float(f"{x:.3g}")
    factor, name = next((unit for unit in units if abs(x) >= unit[0]), units[-1])
    return f"{sig(x / factor)} {name}"


def rate(bytes_per_s: float) -> str:
    """Bytes/s at a human scale: ``"2.0 GB/s"``, ``"100 MB/s"``."""
    return _scaled(bytes_per_s, SIZE_UNITS, "B") + "/s"


def duration(s: float) -> str:
    """Seconds at a human scale: ``"50 us"``, ``"100 ms"``, ``"5.55 s"``, ``"12.2 min"``, ``"16.6 h"``."""
    if s < 120:
        return _scaled(s, _TIME_UNITS, "s")
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def count_text(n: float) -> str:
    """A count with thousands separators (``"5,500"``); a fraction to 3 significant digits."""
    return f"{n:,.0f}" if float(n).is_integer() else sig(n)


# What a figure of None means, where it means more than "none".
_NONE_MEANS = {"request_rate_limit": "none (unlimited)", "cores_per_node": "1 per worker"}


def _figure(name: str, value: float | None) -> str:
    """A figure of the table with its unit, read from its name (``latency_ms``, ``*_s``,
    ``*_s_per_sample``, ``*_s_per_byte``, ``bandwidth_*``, ``*_bytes``), at a human scale:
    ``"2.0 GB/s"``, ``"50 us"``, ``"5,500 GETs/s"``; never scientific notation."""
    if value is None:
        return _NONE_MEANS.get(name, "none")
    if name.endswith("_ms"):
        return duration(value / 1e3)
    if "bandwidth" in name:
        return rate(value)
    if name.endswith("_s_per_byte"):
        return duration(value * 1e6) + "/MB"
    if "_s_per_sample" in name or name.endswith("_s"):
        return duration(value)
    if name == "request_rate_limit":
        return f"{count_text(value)} GETs/s"
    if name.endswith("_bytes"):
        return size(value)
    return count_text(value)


def _setting_value(setting: str, value: Any) -> str:
    """A recommendation's value for the table: bytes at a human scale with the exact count
    (``"268.4 MB (268,435,456 bytes)"``), counts with thousands separators, text as it is."""
    if isinstance(value, str) or isinstance(value, bool):
        return str(value)
    if "bytes" in setting:
        return f"{size(value)} ({value:,} bytes)"
    return count_text(value)
