"""The sample shuffle buffer: seeded, swap-with-last-and-pop."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["shuffle_buffer"]

T = TypeVar("T")


def shuffle_buffer(
    items: Iterable[T], *, capacity_samples: int, rng: random.Random, initial_samples: int | None = None
) -> Iterator[T]:
    """Yield ``items`` in a random order, holding at most ``capacity_samples`` of them.

    The buffer starts yielding once it holds ``initial_samples`` (default: full) and, until it
    is full, takes in two items per item yielded (the ramp of WebDataset's buffer, which
    :func:`shardstream.reading.plan.buffer_order` also has), so the first item need not wait for a
    full buffer; then each new item replaces a randomly chosen one, which is yielded. At the
    end the rest comes out in random order. ``capacity_samples <= 1`` keeps the order.

    Args:
        items: the input stream.
        capacity_samples: how many items the buffer holds.
        rng: the random source (seed it for a repeatable order).
        initial_samples: items held before the first is yielded (1 to ``capacity_samples``).
    """
    if capacity_samples <= 1:
        yield from items
        return
    items = iter(items)
    initial = capacity_samples if initial_samples is None else min(max(1, initial_samples), capacity_samples)
    buffer: list[T] = list(itertools.islice(items, initial))
    for item in items:
        i = rng.randrange(len(buffer))
        out, buffer[i] = buffer[i], item
        yield out
        if len(buffer) < capacity_samples:
            buffer.extend(itertools.islice(items, 1))
    while buffer:
        i = rng.randrange(len(buffer))
        buffer[i], buffer[-1] = buffer[-1], buffer[i]
        yield buffer.pop()
