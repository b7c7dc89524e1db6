"""Runs of a local shard read straight into a caller's buffer (:class:`FileRun`), not sliced
into sample dicts: one ``preadv`` puts a span of samples' payloads back to back in the buffer
(the collators' batches, :mod:`shardstream.reading.batching`) and the tar headers between them
in a scratch buffer, where they are checked against the shard's table as the slicer checks
them (:meth:`~shardstream.reading.slicer.RunSlices.check`)."""

from __future__ import annotations

import itertools
import operator
import os
from typing import Any

import numpy as np

from ..errors import CorruptShardError
from ..format import BLOCK_BYTES
from .slicer import HEAD_BYTES, RunSlices, cut_short

__all__ = ["FileRun"]

_IOV_MAX = 1024  # buffers one preadv takes (Linux's IOV_MAX)
_ROW_BYTES = 1024  # FileRun's scratch: a member's padding and header, at the end of a row of this


class FileRun:
    """A run of a local shard whose samples are not sliced out one by one but read on demand
    straight into a caller's buffer (:meth:`read_into`): one ``preadv`` puts a span of
    samples' payloads back to back in the buffer and the tar headers, padding and label
    members between them in a scratch buffer, where the headers are checked against the
    table as for sliced runs. The shard is opened by path at each read, so a ``FileRun``
    stays readable after the engine has moved on to the next run.

    Args:
        path: the shard's file.
        slices: where the run's samples lie (its table's columns).

    Attributes:
        url: the shard's URL, named in errors.
        num_samples: samples in the run.
        keys: their keys.
        extensions: every sample's member extensions, in the shard's order.
    """

    __slots__ = ("_first", "_gaps", "_scratch", "_sizes", "extensions", "keys", "num_samples", "path", "slices", "url")

    def __init__(self, path: str, slices: RunSlices) -> None:
        assert slices.uniform is not None  # internal invariant: the engine makes FileRuns of uniform tables only
        self.path, self.slices, self.url = path, slices, slices.url
        self.num_samples, self.keys, self.extensions = slices.num_samples, slices.keys, slices.uniform
        offsets, sizes = slices.offsets, slices.sizes
        gaps = np.empty(len(offsets), np.int64)  # the bytes before each member's payload: padding, headers
        gaps[1:] = offsets[1:] - offsets[:-1] - sizes[:-1]
        gaps[:1] = BLOCK_BYTES
        # Python lists, built once a run: a batch's pieces are made from their slices, in C
        self._gaps, self._sizes, self._first = gaps.tolist(), sizes.tolist(), slices.member_first.tolist()
        self._scratch: bytearray | None = None

    def samples(self, i: int, j: int) -> list[dict[str, Any]]:
        """Samples ``i`` to ``j - 1`` as dicts, as a sliced run gives them (read as
        :meth:`read_into` reads, so checked alike)."""
        sizes = self.kept_sizes(i, j)
        block = bytearray(sum(sizes))
        self.read_into(i, j, memoryview(block))
        held = memoryview(block)
        out, url, exts = [], self.url, self.extensions
        members = map(held.__getitem__, map(slice, *_bounds(sizes)))
        for key in self.keys[i:j]:
            sample: dict[str, Any] = {"__key__": key, "__shard__": url}
            for ext in exts:
                sample[ext] = bytes(next(members))
            out.append(sample)
        return out

    def kept_sizes(self, i: int, j: int, aside: int | None = None) -> list[int]:
        """The sizes of samples ``i`` to ``j - 1``'s members in the order :meth:`read_into`
        puts them in its buffer (the ``aside`` members left out)."""
        k = len(self.extensions)
        ma = self._first[i] if i < self.num_samples else len(self._sizes)
        sizes = self._sizes[ma : ma + (j - i) * k]
        if aside is None:
            return sizes
        return list(itertools.compress(sizes, [e != aside for e in range(k)] * (j - i)))

    def read_into(self, i: int, j: int, out: memoryview, *, aside: int | None = None) -> list[bytes]:
        """Read samples ``i`` to ``j - 1``: each sample's members (the member at position
        ``aside`` of :attr:`extensions` excepted) into ``out`` back to back, sample after
        sample, members in :attr:`extensions` order (:meth:`kept_sizes`); ``out`` must hold
        exactly their bytes.

        Returns:
            the ``aside`` members' bytes, one a sample (empty without ``aside``).

        Raises:
            CorruptShardError: the file ends before sample ``j - 1`` does, or a header
                disagrees with the table (naming the shard, member and byte).
            ValueError: ``out`` does not hold exactly the members' bytes.
        """
        if i >= j:
            return []
        k = len(self.extensions)
        ma = self._first[i]
        n = (j - i) * k
        gaps, sizes = self._gaps[ma : ma + n], self._sizes[ma : ma + n]
        gaps[0] = BLOCK_BYTES  # the read starts at sample i's first header
        kept = self.kept_sizes(i, j, aside)
        if sum(kept) != len(out):
            raise ValueError(f"read_into: the members take {sum(kept)} bytes, but the buffer holds {len(out)}")
        out_begin, out_end = _bounds(kept)
        # The scratch buffer: each member's gap (padding, then its headers, the last 512
        # bytes) at the end of a row of its own, so the headers are rows of a numpy view;
        # a gap longer than a row (PAX or long-name records) packs every gap back to back.
        # The aside members' payloads follow.
        rows = max(gaps) <= _ROW_BYTES
        if rows:
            gap_end = list(range(_ROW_BYTES, (n + 1) * _ROW_BYTES, _ROW_BYTES))
            gap_begin = list(map(operator.sub, gap_end, gaps))
        else:
            gap_begin, gap_end = _bounds(gaps)
        put_aside = [] if aside is None else sizes[aside::k]
        aside_begin, aside_end = _bounds(put_aside, gap_end[-1])
        scratch = self._scratch_of(gap_end[-1] + sum(put_aside))
        held = memoryview(scratch)
        pieces: list[Any] = [None] * (2 * n)
        pieces[0::2] = map(held.__getitem__, map(slice, gap_begin, gap_end))
        to_out = map(out.__getitem__, map(slice, out_begin, out_end))
        if aside is None:
            pieces[1::2] = to_out
        else:
            payloads: list[Any] = [None] * n
            payloads[aside::k] = map(held.__getitem__, map(slice, aside_begin, aside_end))
            kept_views = list(to_out)
            for e, f in enumerate(f for f in range(k) if f != aside):
                payloads[f::k] = kept_views[e :: k - 1]
            pieces[1::2] = payloads
        run = self.slices
        self._read(pieces, int(run.starts[i]), i, j)
        if rows:
            table = np.frombuffer(scratch, np.uint8, n * _ROW_BYTES).reshape(n, _ROW_BYTES)
            found = table[:, _ROW_BYTES - BLOCK_BYTES : _ROW_BYTES - BLOCK_BYTES + HEAD_BYTES]
            heads_at = np.arange(1, n + 1, dtype=np.int64) * _ROW_BYTES - BLOCK_BYTES
        else:
            heads_at = np.array(gap_end, np.int64) - BLOCK_BYTES
            found = np.frombuffer(scratch, np.uint8)[heads_at[:, None] + np.arange(HEAD_BYTES)]
        error = run.check(_Scratch(found, scratch, run.offsets[ma : ma + n] - BLOCK_BYTES, heads_at), ma, ma + n)
        if error is not None:
            raise error[1]
        return [bytes(held[a:b]) for a, b in zip(aside_begin, aside_end)]

    def _scratch_of(self, nbytes: int) -> bytearray:
        """This run's scratch buffer, of ``nbytes`` at least (kept: one allocation a run)."""
        if self._scratch is None or len(self._scratch) < nbytes:
            self._scratch = bytearray(nbytes)
        return self._scratch

    def _read(self, pieces: list[memoryview], start: int, i: int, j: int) -> None:
        """``pieces`` filled from the shard's byte ``start`` on, ``_IOV_MAX`` at a time."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptShardError(
                f"{self.url}: the shard file is gone while it is read ({self.path}); do not delete or move shards of "
                "a dataset in use"
            ) from None
        try:
            pos = start
            for first in range(0, len(pieces), _IOV_MAX):
                chunk = pieces[first : first + _IOV_MAX]
                want = sum(map(len, chunk))
                got = os.preadv(fd, chunk, pos)
                while 0 < got < want:  # a short read that is not the file's end: read on
                    chunk, got, want, pos = _rest(chunk, got), 0, want - got, pos + got
                    got = os.preadv(fd, chunk, pos)
                if got < want:
                    self._ended(min(pos + got, os.fstat(fd).st_size), i, j)
                pos += got
        finally:
            os.close(fd)

    def _ended(self, pos: int, i: int, j: int) -> None:
        ends = self.slices.ends
        raise cut_short(self.slices, pos, i + int(np.searchsorted(ends[i:j], pos, side="right")))


def _bounds(sizes: list[int], start: int = 0) -> tuple[list[int], list[int]]:
    """Where pieces of ``sizes`` laid back to back from ``start`` begin and end."""
    at = list(itertools.accumulate(sizes, initial=start))
    return at[:-1], at[1:]


def _rest(pieces: list[memoryview], done: int) -> list[memoryview]:
    """``pieces`` less their first ``done`` bytes."""
    out = []
    for piece in pieces:
        if done >= len(piece):
            done -= len(piece)
            continue
        out.append(piece[done:])
        done = 0
    return out


class _Scratch:
    """The headers :meth:`FileRun.read_into` read into its scratch buffer, as the view
    :meth:`RunSlices.check` reads: their checked bytes, and a header's 512 bytes by its shard
    offset."""

    __slots__ = ("found", "headers", "heads_at", "scratch")

    def __init__(self, found: np.ndarray, scratch: bytearray, headers: np.ndarray, heads_at: np.ndarray) -> None:
        self.found, self.scratch, self.headers, self.heads_at = found, scratch, headers, heads_at

    def heads(self, headers: np.ndarray) -> np.ndarray:
        assert len(headers) == len(self.headers)  # internal invariant: _check asks for every header read
        return self.found

    def span(self, a: int, b: int) -> bytes:
        at = int(self.heads_at[int(np.searchsorted(self.headers, a))])
        return bytes(self.scratch[at : at + b - a])
