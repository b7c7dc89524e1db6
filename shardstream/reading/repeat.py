"""Skip-and-repeat (``on_error="skip"``), written once for every reader and DALI's feed. No torch.

A skipped sample (in a corrupt part of a shard, or undecodable) is replaced by a repeat of the
previous good one, or, at the start, of the next good one, so every rank keeps its count and
DDP ranks stay in step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Repeater"]

T = TypeVar("T")


class Repeater(Generic[T]):
    """Feed items one at a time (:meth:`take`); get back what to hand on in their place.

    Args:
        replace: the repeat that stands for a skipped item: ``replace(good, skipped)``
            (default: the good item itself).
    """

    def __init__(self, replace: Callable[[T, T], T] | None = None) -> None:
        self._replace = replace
        self._last: T | None = None
        self._owed = 0  # skipped before the first good item
        self.skipped = 0

    def take(self, item: T, *, skipped: bool) -> list[T]:
        """The items to hand on for ``item``: none (skipped before any good one), one (itself,
        or a repeat in its place), or the first good one with a repeat for each owed."""
        if skipped:
            self.skipped += 1
            if self._last is None:
                self._owed += 1
                return []
            return [self._replace(self._last, item) if self._replace is not None else self._last]
        self._last = item
        owed, self._owed = self._owed, 0
        return [item] * (owed + 1)

    @property
    def owed(self) -> int:
        """Items skipped with no good one yet to repeat (at the end: the caller raises)."""
        return self._owed
