"""The reading order of a worker's piece of an exact epoch (:mod:`.plan`, steps 4 and 5): the
seeded interleaving of its lanes' arrivals (:func:`interleaving`) and the order in which a
shuffle buffer of ``capacity`` samples emits them (:func:`iter_buffer_order`,
:func:`buffer_order`, and what it still holds after some emissions: :func:`buffer_state`),
all computed on positions alone, before any byte is read. No torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["DRAW_CHUNK", "buffer_order", "buffer_state", "interleaving", "iter_buffer_order", "ramp_samples"]

DRAW_CHUNK = 1 << 16  # positions drawn at a time (interleavings, buffer evictions)


def ramp_samples(capacity: int) -> int:
    """Samples a shuffle buffer of ``capacity`` holds before it first emits: a tenth of it."""
    return max(1, capacity // 10)


def iter_buffer_order(
    count: int, capacity: int, rng: np.random.Generator, *, start: int = 0, state: tuple[int, np.ndarray] | None = None
) -> Iterator[int]:
    """The emission order of a shuffle buffer of ``capacity`` samples fed ``0..count-1``, one
    arrival index at a time (:func:`buffer_order`), so a reader needs no array of it up front;
    from emission ``start`` on (a resume: the buffer's state there worked out by
    :func:`buffer_state`, vectorised, not stepped through; ``state``: that state, when the
    caller has it already)."""
    if capacity <= 1 or count <= 1:
        yield from range(start, count)
        return
    if start:
        if start > _first_phase_steps(count, capacity):  # the rest leave in the order buffer_state drew
            yield from buffer_state(count, capacity, rng, start)[1].tolist()
            return
        if state is None:
            state = buffer_state(count, capacity, rng, start)  # ``start`` draws taken from rng
        else:  # buffer_state(count, capacity, <a generator like rng>, start), worked out already
            rng.bit_generator.advance(start)  # a double is one 64-bit draw: as its ``start`` draws would
        arrived, held = state
        buf, emitted = held.tolist(), start
        if arrived >= count:  # the first phase just ended: the rest leave in random order
            rng.random(count - start)
            yield from rng.permutation(held).tolist()
            return
    else:
        buf = list(range(min(ramp_samples(capacity), count)))
        arrived, emitted = len(buf), 0
    drawn = emitted  # the draws come from one stream of ``count`` doubles, taken a chunk at a time
    draws: list[float] = []
    while arrived < count:
        if emitted == drawn:
            take = min(DRAW_CHUNK, count - drawn)
            draws, drawn = rng.random(take).tolist(), drawn + take
        j = int(draws[emitted - drawn + len(draws)] * len(buf))
        yield buf[j]
        emitted += 1
        buf[j] = arrived
        arrived += 1
        if len(buf) < capacity and arrived < count:
            buf.append(arrived)
            arrived += 1
    if drawn < count:
        rng.random(count - drawn)  # the rest of the stream, as one draw of ``count`` would use
    yield from rng.permutation(np.asarray(buf, dtype=np.int64)).tolist()


def _first_phase_steps(count: int, capacity: int) -> int:
    """Emissions of :func:`iter_buffer_order` while arrivals still come (then the rest leave)."""
    ramp = min(ramp_samples(capacity), count)
    grow = max(0, min(capacity - ramp, (count - ramp) // 2))
    if ramp >= count:
        return 0
    if ramp + 2 * grow >= count:
        return -(-(count - ramp) // 2)
    return count - ramp - grow


def buffer_order(count: int, capacity: int, rng: np.random.Generator) -> np.ndarray:
    """The emission order of a shuffle buffer of ``capacity`` samples fed ``0..count-1``.

    It emits its first sample once it holds :func:`ramp_samples` of them, and takes in two
    arrivals per emission until it holds ``capacity`` (as WebDataset's buffer does), so the
    first sample does not wait for a full buffer; from then on each arrival evicts a random
    slot; at the end the rest leave in random order.

    Returns:
        int64 array of shape ``(count,)``, a permutation of ``0..count-1``.
    """
    return np.fromiter(iter_buffer_order(count, capacity, rng), dtype=np.int64, count=count)


def buffer_state(count: int, capacity: int, rng: np.random.Generator, emitted: int) -> tuple[int, np.ndarray]:
    """Where the shuffle buffer of :func:`iter_buffer_order` (fed ``0..count-1``, draws from
    ``rng``) stands after ``emitted`` emissions: how many arrivals it has taken in, and the
    arrival indices it still holds (int64, unordered). Every arrival below the first number
    and not held was emitted. Vectorised: O(emitted) numpy work, no step per sample in Python.
    """
    if emitted >= count:
        return count, np.empty(0, np.int64)
    if capacity <= 1 or count <= 1:
        return emitted, np.empty(0, np.int64)
    ramp = min(ramp_samples(capacity), count)
    grow = max(0, min(capacity - ramp, (count - ramp) // 2))  # steps that also append an arrival

    def arrived_before(step: int) -> int:  # arrivals taken in before step ``step`` of the first phase
        return ramp + 2 * step if step <= grow else ramp + grow + step

    if ramp >= count:
        steps = 0
    elif ramp + 2 * grow >= count:
        steps = -(-(count - ramp) // 2)
    else:
        steps = count - ramp - grow
    done = min(emitted, steps)
    j = np.arange(done, dtype=np.int64)
    length = ramp + np.minimum(j, grow)  # the buffer's size at each step
    slot = (rng.random(done) * length).astype(np.int64)  # as int(draw * len(buf))
    replaced_by = np.where(j < grow, ramp + 2 * j, ramp + grow + j)
    size = ramp + min(done, grow)
    held = np.arange(size, dtype=np.int64)
    held[ramp:] = ramp + 2 * np.arange(size - ramp, dtype=np.int64) + 1  # appended while growing
    if done:
        latest = np.full(size, -1, dtype=np.int64)  # each slot's latest step (-1: none)
        np.maximum.at(latest, slot, j)  # (an unbuffered ufunc: ~15 ns a step, where a sort took 300)
        hit = np.flatnonzero(latest >= 0)
        held[hit] = replaced_by[latest[hit]]
    if emitted <= steps:
        return arrived_before(done), held
    rng.random(count - done)  # the rest of the stream, as iter_buffer_order draws it
    return count, rng.permutation(held)[emitted - steps :]


def _draw_counts(rng: np.random.Generator, remaining: np.ndarray, n: int) -> np.ndarray:
    """How many of the next ``n`` arrivals each lane gives, of a uniformly random interleaving
    of lanes with ``remaining`` samples each: multivariate hypergeometric (exact). numpy draws
    that for fewer than 10^9 samples in all; above, where ``n`` is a vanishing share of every
    lane that can give it, a multinomial with the same means (clipped to what lanes hold)."""
    if int(remaining.sum()) < 1_000_000_000:
        return rng.multivariate_hypergeometric(remaining, n)
    counts = np.minimum(rng.multinomial(n, remaining / remaining.sum()), remaining)
    for lane in np.flatnonzero(remaining > counts).tolist():  # what clipping took, from lanes with room
        extra = min(int(remaining[lane] - counts[lane]), n - int(counts.sum()))
        counts[lane] += extra
    return counts


def interleaving(counts: Sequence[int], seed: Sequence[int], dtype: Any) -> Iterator[np.ndarray]:
    """A seeded uniformly random interleaving of streams holding ``counts`` items: the stream
    of each item in turn, in ``dtype`` arrays of up to 65,536, each drawn when asked for (a
    worker's lanes; a mixture's sources with ``mix="random"``)."""
    remaining = np.asarray(counts, np.int64).copy()
    rng = np.random.default_rng(list(seed))
    streams = np.arange(len(remaining), dtype=dtype)
    left = int(remaining.sum())
    while left:
        n = min(DRAW_CHUNK, left)
        drawn = _draw_counts(rng, remaining, n)
        chunk = np.repeat(streams, drawn)
        rng.shuffle(chunk)
        remaining -= drawn
        left -= n
        yield chunk
