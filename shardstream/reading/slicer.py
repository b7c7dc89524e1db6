"""Samples sliced out of a shard by its sample table, with no tar header parsed one by one.

Where a shard's table (:mod:`shardstream.index.table`) is at hand, member ``j``'s payload is
``shard[offsets[j]:offsets[j] + sizes[j]]``: one slice of the mapped file (local shards and
cache entries) or of the pieces S3 sent (a sample split between two pieces is joined first),
so each payload is copied once. Samples come in batches of up to 16 MiB and 4,096 samples
(:class:`Sliced`; a remote part is one batch): numpy works out a batch's slices at once, and its
dicts are built as the batch is iterated. The batches are that large because each costs some
thirty numpy calls (about 0.1 ms): at 1 MiB they were a fifth of the instructions the slicer ran
besides copying, on 18 KB samples (``bench/slicer.py``).

What the tar says is still checked against the table, a batch at a time with numpy (about
0.2 us a member): each member's header (the 512 bytes before its payload) must give the
table's size, a regular-file type and, for ASCII names of up to 100 bytes (nearly all), the
table's name, so keys too, as a member's name is its sample's key and extension. A header
that disagrees is read again with the tar parser's own rules
(:func:`~shardstream.tarstream.read_header`, which checks its checksum), and a real
disagreement raises CorruptShardError naming the shard, member and byte; so does a stream
that ends before the run's last sample. What is not read is not checked: a header's other
fields (mode, times, owner), whose damage changes no sample, and payload bytes, which tar
does not checksum either (``ShardDataset(verify_checksums=True)`` checks every byte of a
shard read whole against the index's CRC-32; so does ``shardstream verify``).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import CorruptShardError
from ..format import BLOCK_BYTES, RESERVED_FIELDS
from ..index.table import ShardTable
from ..tarstream import Batch, Chunk, Pieces, Window, read_header

__all__ = ["BATCH_SAMPLES", "HEAD_BYTES", "RunSlices", "Sliced", "cut_short", "iter_sliced_batches"]

BATCH_SAMPLES = 4096  # samples checked and counted together, at most ...
BATCH_BYTES = 16 << 20  # ... and about this many bytes of them (a remote part; a first sample waits for no more)
HEAD_BYTES = 157  # a header's bytes that are checked: name (0-99), size (124-135), type (156)
# Headers a received piece must hold on average for numpy to gather them (about 19,000
# instructions a piece, some 1,200 fewer a header than a Python slice each; callgrind of
# bench/slicer.py at --piece-kib 64, 256 and 1024): reads from a fast server come in pieces
# of ~1 MiB (~100 headers of 18 KB samples), from a slow one of 64-256 KiB (7-27).
_GATHER_ROWS = 16
# A header's checked bytes as one opaque item, so that numpy gathers each with one copy: about
# three times as fast as taking rows of a 2-D view (timeit, a 1 MiB piece of 18 KB samples).
_HEAD = np.dtype(f"V{HEAD_BYTES}")


def _rows(heads: np.ndarray) -> np.ndarray:
    """Gathered :data:`_HEAD` items as uint8 rows, one a header (a view)."""
    return heads.view(np.uint8).reshape(len(heads), HEAD_BYTES)


class RunSlices:
    """Where the wanted samples of one run lie in their shard, from its table: numpy columns
    for the run (O(its members), built once), the samples' keys and the members' extensions.

    Args:
        table: the shard's table.
        samples: int64 indices of the wanted samples in the shard, ascending.
        url: the shard's URL, named in errors.

    Raises:
        CorruptShardError: a sample holds an extension twice or a reserved one.
    """

    def __init__(self, table: ShardTable, samples: np.ndarray, *, url: str) -> None:
        self.url = url
        starts = table.member_start
        first, counts = starts[samples], starts[samples + 1] - starts[samples]
        n = len(samples)
        keys = table.keys()
        lo = int(samples[0]) if n else 0
        if n and int(samples[-1]) - lo + 1 == n:
            self.keys = keys[lo : lo + n]
        else:
            self.keys = [keys[i] for i in samples.tolist()]
        total = int(counts.sum())
        self.member_first = np.cumsum(counts) - counts  # each sample's first member, in the run's members
        rows = np.repeat(first - self.member_first, counts) + np.arange(total)  # the members' table rows
        self.offsets, self.sizes = table.offsets[rows], table.sizes[rows]
        last = self.member_first + counts - 1
        self.starts = self.offsets[self.member_first] - BLOCK_BYTES  # each sample's first header
        self.ends = self.offsets[last] + self.sizes[last] if n else np.zeros(0, np.int64)
        self.num_samples = n
        self.uniform = table.extensions
        if self.uniform is not None:
            self.width = len(self.uniform)
            self.exts: list[str] = []
            _check_extensions(self.uniform, url, self.keys[0] if n else "")
        else:
            self.width = 0
            every = table.member_extensions
            self.exts = [every[r] for r in rows.tolist()]
            self.counts = counts.tolist()
            self.first_list = self.member_first.tolist()
        names, name_offsets = table.name_bytes()
        self.names = names
        self.name_starts = name_offsets[rows]
        lengths = self.name_full_lengths = name_offsets[rows + 1] - self.name_starts
        ascii_names = _ascii_runs(names, self.name_starts, lengths)
        # names the header's name field holds whole: checked byte for byte; others (long or
        # non-ASCII, which writers may put in PAX or GNU long-name records) are not
        self.name_lengths = np.where((lengths <= 100) & ascii_names, lengths, 0)
        self.expected = _expected_headers(names, self.name_starts, self.name_lengths, self.sizes)
        self.checked = self.name_lengths > 0

    def batches(self, view: _Flat | _Spread, i: int, j: int) -> Iterator[Batch]:
        """Samples ``i`` to ``j - 1`` of the run (all inside ``view``), checked, in batches
        of :data:`BATCH_SAMPLES`."""
        a = i
        while a < j:
            b = min(a + BATCH_SAMPLES, j, max(a + 1, int(np.searchsorted(self.ends, self.starts[a] + BATCH_BYTES))))
            ma, mb = (
                int(self.member_first[a]),
                (int(self.member_first[b]) if b < self.num_samples else len(self.offsets)),
            )
            error = self.check(view, ma, mb)
            if error is None:
                yield self._build(view, a, b, ma, mb)
                a = b
                continue
            bad_member, exc = error
            c = int(np.searchsorted(self.member_first, bad_member, side="right")) - 1  # its sample
            if c > a:  # the samples before the damage, as a tar parser would have given them
                yield self._build(view, a, c, ma, int(self.member_first[c]))
            raise exc

    def _build(self, view: _Flat | _Spread, a: int, b: int, ma: int, mb: int) -> Batch | Sliced:
        url, keys = self.url, self.keys[a:b]
        bufs, where, begin, end = view.locate(self.offsets[ma:mb], self.offsets[ma:mb] + self.sizes[ma:mb])
        nbytes = int(self.sizes[ma:mb].sum())
        uniform = self.uniform
        if uniform:  # the same members in every sample (self.width of them): dicts built as the batch is iterated
            if len(uniform) == 1:
                (e0,) = uniform
                return Sliced(
                    (
                        {"__key__": key, "__shard__": url, e0: bufs[w0][s0:t0]}
                        for key, w0, s0, t0 in zip(keys, where.tolist(), begin.tolist(), end.tolist())
                    ),
                    b - a,
                    nbytes,
                )
            if len(uniform) == 2:
                e0, e1 = uniform
                return Sliced(
                    (
                        {"__key__": key, "__shard__": url, e0: bufs[w0][s0:t0], e1: bufs[w1][s1:t1]}
                        for key, w0, s0, t0, w1, s1, t1 in zip(
                            keys,
                            where[0::2].tolist(),
                            begin[0::2].tolist(),
                            end[0::2].tolist(),
                            where[1::2].tolist(),
                            begin[1::2].tolist(),
                            end[1::2].tolist(),
                        )
                    ),
                    b - a,
                    nbytes,
                )
            return Sliced(
                _samples(bufs, url, keys, uniform, where.tolist(), begin.tolist(), end.tolist()), b - a, nbytes
            )
        out = Batch(nbytes=nbytes)  # members that differ between samples: checked and built now
        wheres, starts, ends = where.tolist(), begin.tolist(), end.tolist()
        for key, first, count in zip(keys, self.first_list[a:b], self.counts[a:b]):
            sample = {"__key__": key, "__shard__": url}
            for m in range(first - ma, first - ma + count):
                sample[self.exts[m + ma]] = bufs[wheres[m]][starts[m] : ends[m]]
            if len(sample) != count + 2:
                exts = self.exts[first : first + count]
                twice = next(e for e in exts if exts.count(e) > 1)
                raise CorruptShardError(
                    f"{url}: sample {key!r} holds extension {twice!r} twice; members of a sample must have "
                    "distinct extensions"
                )
            out.append(sample)
        for ext in set(self.exts[ma:mb]) & RESERVED_FIELDS:
            raise CorruptShardError(f"{url}: a member of this shard uses reserved extension {ext!r}")
        return out

    def check(self, view: _Flat | _Spread, ma: int, mb: int) -> tuple[int, CorruptShardError] | None:
        """The first of members ``ma`` to ``mb - 1`` whose header disagrees with the table
        (module doc), and the error that says so; None if all agree."""
        headers = self.offsets[ma:mb] - BLOCK_BYTES
        expected = {field: rows[ma:mb] for field, rows in self.expected.items()}
        for m in _mismatches(view.heads(headers), expected, self.checked[ma:mb]):
            offset = int(headers[m])
            try:
                name, size, regular = read_header(view.span(offset, offset + BLOCK_BYTES), url=self.url, offset=offset)
            except CorruptShardError as exc:
                return ma + m, exc
            row = ma + m
            start = int(self.name_starts[row])
            want = self.names[start : start + int(self.name_full_lengths[row])].tobytes()
            want_name = want.decode("utf-8", "surrogateescape")
            want_size = int(self.sizes[row])
            if regular and size == want_size and (name == want_name or not self.name_lengths[row]):
                continue  # a layout numpy does not read (spaces in a number, a split name), but the same member
            return row, CorruptShardError(
                f"{self.url}: the tar header at byte {offset} gives member {name!r} of {size} bytes"
                f"{'' if regular else ', not a regular file'}, but the index says {want_name!r} of "
                f"{want_size} bytes; the shard or its index is stale or damaged, re-pack or re-upload the dataset"
            )
        return None


class Sliced:
    """A batch of samples built as they are iterated (once), from slices a run worked out
    for them all: so the bytes of a batch are not all held at once, and malloc reuses the
    memory of a payload the consumer has dropped (all of them at once, it gave pages back
    to the kernel and faulted them in again: half the speed on 18 KB samples). Its buffer
    stays valid while the run's stream is current, which the readers' order keeps."""

    __slots__ = ("_count", "_samples", "nbytes")

    def __init__(self, samples: Iterator[dict[str, Any]], count: int, nbytes: int) -> None:
        self._samples, self._count, self.nbytes = samples, count, nbytes

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._samples


def _samples(
    bufs: list[Any],
    url: str,
    keys: list[str],
    exts: tuple[str, ...],
    where: list[int],
    starts: list[int],
    ends: list[int],
) -> Iterator[dict[str, Any]]:
    k = len(exts)
    for n, key in enumerate(keys):
        sample: dict[str, Any] = {"__key__": key, "__shard__": url}
        for m, ext in enumerate(exts, n * k):
            sample[ext] = bufs[where[m]][starts[m] : ends[m]]
        yield sample


class _Flat:
    """Shard bytes held in one buffer: ``buf``'s byte ``x - origin`` is the shard's byte ``x``
    (a mapped shard, a window of one, or a piece)."""

    __slots__ = ("buf", "origin")

    def __init__(self, buf: Any, origin: int) -> None:
        self.buf, self.origin = buf, origin

    def span(self, a: int, b: int) -> bytes:
        """Shard bytes ``a`` to ``b - 1``."""
        return self.buf[a - self.origin : b - self.origin]

    def locate(self, begin: np.ndarray, end: np.ndarray) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
        """Where shard bytes ``begin[m]`` to ``end[m] - 1`` lie: ``bufs[where[m]][begin'[m]:end'[m]]``."""
        return [self.buf], np.zeros(len(begin), np.intp), begin - self.origin, end - self.origin

    def heads(self, headers: np.ndarray) -> np.ndarray:
        """The first :data:`HEAD_BYTES` of each 512-byte header at shard bytes ``headers``
        (uint8, one row each)."""
        buf, origin = self.buf, self.origin
        skip = (-origin) % BLOCK_BYTES  # headers lie on the shard's 512-byte blocks
        blocks = np.ndarray(((len(buf) - skip) // BLOCK_BYTES,), _HEAD, buffer=buf, offset=skip, strides=(BLOCK_BYTES,))
        try:
            return _rows(blocks[(headers - origin - skip) // BLOCK_BYTES])  # a copy: the map can close
        finally:
            del blocks


class _Spread:
    """Shard bytes ``origin`` onwards held in consecutive pieces (:class:`Pieces`: one ranged
    GET's body as received). A member inside a piece is sliced from it; one that spans pieces
    (about one a piece) is joined from them."""

    __slots__ = ("ends", "pieces", "starts")

    def __init__(self, pieces: list[bytes], origin: int) -> None:
        self.pieces = pieces
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        self.ends = origin + np.cumsum(lengths)
        self.starts = self.ends - lengths

    def span(self, a: int, b: int) -> bytes:
        k = int(np.searchsorted(self.starts, a, side="right")) - 1
        out = []
        while a < b:  # views of the pieces, so the join is the one copy
            at = a - int(self.starts[k])
            piece = memoryview(self.pieces[k])[at : at + b - a]
            out.append(piece)
            a += len(piece)
            k += 1
        return b"".join(out)

    def locate(self, begin: np.ndarray, end: np.ndarray) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
        where = np.searchsorted(self.starts, begin, side="right") - 1
        base = self.starts[where]
        begin, end = begin - base, end - base
        across = np.flatnonzero(end > self.ends[where] - base)
        bufs: list[Any] = self.pieces
        if len(across):  # members that span pieces: joined, and sliced whole from the join
            bufs = list(bufs)
            for m in across.tolist():
                bufs.append(self.span(int(begin[m] + base[m]), int(end[m] + base[m])))
                where[m], begin[m], end[m] = len(bufs) - 1, 0, len(bufs[-1])
        return bufs, where, begin, end

    def heads(self, headers: np.ndarray) -> np.ndarray:
        where = np.searchsorted(self.starts, headers, side="right") - 1
        at = headers - self.starts[where]
        # a piece at a time (``headers`` ascending: a piece's rows are consecutive); a header
        # that runs into the next piece (at most one a piece) is joined from the two
        firsts = np.flatnonzero(np.diff(where, prepend=-1))
        pieces = zip(where[firsts].tolist(), firsts.tolist(), [*firsts[1:].tolist(), len(at)])
        across = np.flatnonzero(headers + HEAD_BYTES > self.ends[where]).tolist()
        if len(headers) >= _GATHER_ROWS * len(firsts):  # numpy gathers a piece's rows from a
            out = np.empty((len(headers), HEAD_BYTES), np.uint8)  # view of it as overlapping rows
            for k, a, b in pieces:
                piece = self.pieces[k]
                fits = len(piece) - HEAD_BYTES + 1  # rows that start there lie wholly inside it
                if fits > 0:  # each byte of the piece the start of a header's bytes
                    out[a:b] = _rows(np.ndarray((fits,), _HEAD, piece, 0, (1,))[np.minimum(at[a:b], fits - 1)])
            for m in across:
                h = int(headers[m])
                out[m] = np.frombuffer(self.span(h, h + HEAD_BYTES), np.uint8)
            return out
        ats, found = at.tolist(), []  # few rows a piece (a slow server's small reads): a slice each
        for k, a, b in pieces:
            piece = self.pieces[k]
            found += [piece[x : x + HEAD_BYTES] for x in ats[a:b]]
        for m in across:
            h = int(headers[m])
            found[m] = self.span(h, h + HEAD_BYTES)
        return np.frombuffer(b"".join(found), np.uint8).reshape(len(found), HEAD_BYTES)


def iter_sliced_batches(chunks: Iterable[Chunk | Pieces], run: RunSlices, *, base_offset: int = 0) -> Iterator[Batch]:
    """The run's samples from a shard's bytes, in batches (module doc).

    Args:
        chunks: the shard's bytes from ``base_offset`` on, as a
            :class:`~shardstream.tarstream.ShardStream`'s groups give them: ``bytes``, a memory
            map of the whole shard, a :class:`~shardstream.tarstream.Window` of one, or
            :class:`~shardstream.tarstream.Pieces`. Read to its end.
        run: where the samples lie.
        base_offset: the shard byte the first chunk starts at.

    Raises:
        CorruptShardError: a header disagrees with the table, or the bytes end before the
            run's last sample.
    """
    n = run.num_samples
    starts, ends = run.starts, run.ends
    i = 0
    pos = base_offset
    tail: list[Any] = []  # the start of sample i, split between pieces
    tail_start = 0
    view: _Flat | _Spread
    for chunk in chunks:
        if isinstance(chunk, mmap.mmap):
            view, lo, hi = _Flat(chunk, 0), pos, len(chunk)
        elif type(chunk) is Pieces:
            view, lo, hi = _Spread(chunk.pieces, pos), pos, pos + len(chunk)
        elif type(chunk) is Window:
            buf, lo, hi = chunk.window()
            view = _Flat(buf, 0)
        else:
            view, lo, hi = _Flat(chunk if type(chunk) is bytes else bytes(chunk), pos), pos, pos + len(chunk)
        pos = hi
        if i >= n:
            continue  # the rest of the shard (its end blocks): read through, not used
        if tail:
            need = int(ends[i])
            if need > hi:
                tail.append(view.span(lo, hi))
                continue
            tail.append(view.span(lo, need))
            yield from run.batches(_Flat(b"".join(tail), tail_start), i, i + 1)
            tail = []
            i += 1
        j = int(np.searchsorted(ends, hi, side="right"))
        if j > i:
            yield from run.batches(view, i, j)
            i = j
        if i < n and starts[i] < hi:
            tail_start = int(starts[i])
            tail = [view.span(tail_start, hi)]
    if i < n:
        raise cut_short(run, pos, i)


def cut_short(run: RunSlices, pos: int, i: int) -> CorruptShardError:
    """The error of a shard whose bytes end at ``pos``, before the run's sample ``i`` does."""
    return CorruptShardError(
        f"{run.url}: ends at byte {pos}, but the index says sample {run.keys[i]!r} ends at byte "
        f"{int(run.ends[i])}; the shard is truncated (an interrupted copy?) or its index is stale, re-pack or "
        "re-upload it"
    )


def _mismatches(found: np.ndarray, expected: dict[str, np.ndarray], checked: np.ndarray) -> list[int]:
    """Positions of the members whose header's first bytes (``found``, a uint8 row each) do
    not hold the ``expected`` bytes (:func:`_expected_headers`; names only where ``checked``)
    or type "0" (a regular file). Fields are compared whole, as fixed-width byte strings (one
    comparison a member and field, not one a byte)."""
    size, name = expected["size"], expected["name"]
    bad = found[:, 124:135].view(size.dtype)[:, 0] != size
    bad |= found[:, 156] != ord("0")
    bad |= (found[:, : name.itemsize].view(name.dtype)[:, 0] != name) & checked
    return np.flatnonzero(bad).tolist()


def _expected_headers(
    names: np.ndarray, name_starts: np.ndarray, name_lengths: np.ndarray, sizes: np.ndarray
) -> dict[str, np.ndarray]:
    """Per member, bytes :mod:`shardstream.format` writes in its header, each a fixed-width
    byte string (numpy ``S``): "name", the name and the NULs after it (where ``name_lengths``
    > 0), and "size", its 11 octal digits."""
    width = min(int(name_lengths.max(initial=0)) + 1, 100)
    size = np.empty((len(sizes), 11), np.uint8)
    for digit, shift in enumerate(range(30, -1, -3)):
        size[:, digit] = (sizes >> shift) & 7
    size += ord("0")
    # each member's name and the bytes after it, ``width`` wide: rows of a strided view over
    # the names (padded, so the last has its full width), the bytes past each name zeroed
    padded = np.zeros(len(names) + width, np.uint8)
    padded[: len(names)] = names
    name = np.ndarray((len(names) + 1, width), np.uint8, padded, 0, (1, 1))[name_starts]
    name *= np.arange(width) < name_lengths[:, None]
    return {"name": name.view(f"S{width}")[:, 0], "size": size.view("S11")[:, 0]}


def _ascii_runs(names: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """bool per name: all its bytes are ASCII."""
    if not len(starts):
        return np.zeros(0, bool)
    if names.max(initial=0) < 128:  # nearly always: one pass, no running count
        return np.ones(len(starts), bool)
    high = np.concatenate([[0], np.cumsum(names >= 128)])
    return high[starts + lengths] == high[starts]


def _check_extensions(exts: tuple[str, ...], url: str, key: str) -> None:
    if len(set(exts)) != len(exts):
        twice = next(e for e in exts if exts.count(e) > 1)
        raise CorruptShardError(
            f"{url}: sample {key!r} holds extension {twice!r} twice; members of a sample must have distinct extensions"
        )
    for ext in set(exts) & RESERVED_FIELDS:
        raise CorruptShardError(f"{url}: member {key}.{ext} uses reserved extension {ext!r}")
