"""Timing helpers shared by the benchmarks: rates taken in interleaved rounds, so that the
machine's drift (these machines are noisy) falls on every path of a run alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable


def interleaved_rates(epochs: list[Callable[[], Iterable[int]]], rounds: int) -> list[list[float]]:
    """Items/s of each of ``epochs`` over ``rounds`` rounds, after one warm-up epoch each:
    each round times one epoch of each, in an order rotated every round, so rates of one
    round can be compared pair by pair. An epoch yields the number of items of each step."""
    for epoch in epochs:
        sum(epoch())
    rates: list[list[float]] = [[] for _ in epochs]
    for r in range(rounds):
        for i in [(r + k) % len(epochs) for k in range(len(epochs))]:
            started = time.perf_counter()
            count = sum(epochs[i]())
            rates[i].append(count / (time.perf_counter() - started))
    return rates


def best_rate(epoch: Callable[[], Iterable[int]], repeat: int) -> float:
    """Items/s of the fastest of ``repeat`` epochs after one warm-up epoch."""
    return max(interleaved_rates([epoch], repeat)[0])


def paired_ratios(rates: list[float], base: list[float]) -> list[float]:
    """Round by round, ``rates`` / ``base``."""
    return [a / b for a, b in zip(rates, base)]


def ratio_summary(ratios: list[float], digits: int = 2) -> str:
    """``median M (lo-hi)`` of paired ratios."""
    return f"median {statistics.median(ratios):.{digits}f}x ({min(ratios):.{digits}f}-{max(ratios):.{digits}f}x)"
