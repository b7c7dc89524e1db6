"""The sample shuffle buffer: seeded, swap-with-last-and-pop."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["shuffle_buffer"]

T = TypeVar("T")


def shuffle_buffer(items: Iterable[T], *, capacity_samples: int, rng: random.Random) -> Iterator[T]:
    """Yield ``items`` in a random order, holding at most ``capacity_samples`` of them.

    The buffer fills up first; then each new item replaces a randomly chosen one, which is
    yielded. At the end the rest comes out in random order. ``capacity_samples <= 1`` keeps
    the order.

    Args:
        items: the input stream.
        capacity_samples: how many items the buffer holds.
        rng: the random source (seed it for a repeatable order).
    """
    if capacity_samples <= 1:
        yield from items
        return
    buffer: list[T] = []
    for item in items:
        if len(buffer) < capacity_samples:
            buffer.append(item)
            continue
        i = rng.randrange(capacity_samples)
        out, buffer[i] = buffer[i], item
        yield out
    while buffer:
        i = rng.randrange(len(buffer))
        buffer[i], buffer[-1] = buffer[-1], buffer[i]
        yield buffer.pop()
