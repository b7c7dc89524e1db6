"""The floors the streaming benchmarks hold readers against, and the marks that split each
reader's CPU into start-up and steady work.

- :func:`read_cat`: ``cat`` of the local shards (the disk's floor);
- :func:`read_s3_limit`, :func:`read_s3_threads`: plain ranged GETs of the shard objects, bytes
  discarded (the best of them is the rate floor: no reader that hands out samples goes faster);
- :func:`read_s3_keep` (``s3-keep``), with :func:`keep_copier`: the same GETs keeping each body
  and copying every payload out by the index's offsets, touched as :func:`touched` touches
  every reader's samples: the least a reader that hands out the bytes must do, the floor of
  shardstream's CPU per GB. bench/http_read.py's keep floor is :func:`keep_copier` over http.
- :func:`touched`: how every reader's samples are consumed; :func:`mark_first` and
  :func:`mark_steady`: where a reader's start-up ends.

Used by bench/stream.py (which runs each reader in a subprocess of its own) and
bench/http_read.py; a floor takes bench/stream.py's ``Setup``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procs import rusage_cpu_s

if TYPE_CHECKING:
    from stream import Setup

IMAGE_EXT = "jpg"  # the corpora's image members, whose JPEG markers every reader's samples are checked for
Progress = Iterator[tuple[int, int, int]]  # (samples, bytes, damaged samples) read since the last yield

TOUCHED_EVERY = 256  # samples a progress record of :func:`touched` covers (the first: one)


def touched(samples: Iterable[dict[str, Any]], fields: Iterable[str]) -> Progress:
    """Each raw sample touched: one byte of every 4 KiB of each member in ``fields`` (the
    corpus's extensions, which every sample holds) read, so readers that hand out views of
    memory-mapped files (LitData) actually read their pages, and its JPEG counted as damaged
    where it lacks the start or end marker. The members are looked up by name, as training
    code takes ``sample["jpg"]``: walking each sample's dict and testing every key for the
    ``__`` of metadata cost 1.2 us more a sample of 4 items (2.9 against 1.7 us, timeit; about
    0.06 CPU-s/GB on ~17 KB samples), a cost of the harness that the keep floor, which hands
    out no dict, did not pay. A sample without one of them raises KeyError. Progress is handed on after
    the first sample (start-up ends there), then every :data:`TOUCHED_EVERY` samples: a record
    a sample (the generator, a tuple, the clock, three sums) cost the harness 0.5-0.9 us a
    sample, charged to the readers alone (the keep floor reports once a body)."""
    fields = tuple(fields)
    count = nbytes = damaged = 0
    every = 1
    for sample in samples:
        total = 0
        for field in fields:
            value = sample[field]
            bytes(memoryview(value)[::4096])
            total += len(value)
        image = sample.get(IMAGE_EXT)
        if image is not None and (image[:2] != b"\xff\xd8" or image[-2:] != b"\xff\xd9"):
            damaged += 1
        count, nbytes = count + 1, nbytes + total
        if count == every:
            yield count, nbytes, damaged
            count = nbytes = damaged = 0
            every = TOUCHED_EVERY
    if count:
        yield count, nbytes, damaged


_FIRST: dict[str, Any] = {}  # where the reader's start-up ended (its process runs one reader): see mark_first


def mark_first(samples: int = 0, nbytes: int = 0, *, timed: bool = True) -> None:
    """Start-up ends here, the first time this is called: the reader has its first sample, or
    (a limit, which reads bytes) its first bytes. Records the clock and the process's CPU
    seconds (its own since it started, and its reaped children's); ``samples`` and ``nbytes``,
    what it has read by then, are left out of the steady figures. :func:`reader_main` calls it
    at the first sample a reader yields; readers that yield once, at their end (the limits),
    call it themselves where their first bytes arrive. ``timed=False``: start-up ends here,
    but there is no first sample or byte to time (``cat``, whose bytes another process reads;
    the decode pools). A reader that called :func:`mark_steady` before has its CPU split
    there; this only times its first sample."""
    if "self_cpu" not in _FIRST:
        mark_steady(samples, nbytes)
    if "at" not in _FIRST:
        _FIRST["at"] = time.perf_counter() if timed else None


def mark_steady(samples: int = 0, nbytes: int = 0) -> None:
    """The reader's CPU is split here (once), its first sample still timed by
    :func:`mark_first`: the keep floors call it at their first bytes, as the limits' start-up
    ends. They hand out no sample until a 16 MiB body is whole, by when the 8 GETs in flight
    have received much more; split at their first sample, that receiving counted as start-up
    (on the photos, construction to the split took 0.41-0.63 CPU-s, against 0.28-0.34 at the
    first bytes: 0.1-0.3 CPU-s moved, a tenth to a fifth of the floor's steady figure), so
    their steady figure left out per-byte work that shardstream's, whose first sample comes
    one 2 MiB piece after its first bytes, holds."""
    if "self_cpu" not in _FIRST:
        _FIRST.update(
            self_cpu=rusage_cpu_s(resource.RUSAGE_SELF),
            children_cpu=rusage_cpu_s(resource.RUSAGE_CHILDREN),
            samples=samples,
            bytes=nbytes,
        )


def read_cat(setup: Setup) -> Progress:
    shards = [str(Path(setup.local["shardstream"], n)) for n in setup.shard_names("shardstream", ".tar")]
    mark_first(timed=False)
    subprocess.run(["cat", *shards], stdout=subprocess.DEVNULL, check=True)
    yield 0, sum(os.path.getsize(p) for p in shards), 0


def shard_ranges(setup: Setup, range_bytes: int) -> list[tuple[str, int, int]]:
    """Every shardstream shard object cut into ranged GETs of ``range_bytes``: ``(name, first
    byte, last byte)``, in shard order."""
    local = Path(setup.local["shardstream"])
    return [
        (name, start, min(start + range_bytes, size) - 1)
        for name in setup.shard_names("shardstream", ".tar")
        for size in [(local / name).stat().st_size]
        for start in range(0, size, range_bytes)
    ]


def s3_ranged_gets(
    setup: Setup,
    inflight: int,
    range_bytes: int,
    on_body: Callable[[str, int, list[bytes]], int] | None = None,
    *,
    wide_reads: bool = False,
) -> int:
    """Concurrent aiobotocore ranged GETs of every shardstream shard object, ``range_bytes``
    each, ``inflight`` at a time, timed from client creation; returns the bytes received.
    Without ``on_body`` each body is read 1 MiB at a time and discarded (``wide_reads``: as
    the pieces received, each socket read growing to 2 MiB where reads fill, as shardstream's
    stores read: :func:`~shardstream.storage.requests.aiohttp_pieces`); with it, each body is
    kept as those pieces (uncopied) and handed whole to ``on_body(name, first_byte, pieces)``,
    which returns its byte count."""
    from shardstream.storage.requests import aiohttp_pieces

    ranges = shard_ranges(setup, range_bytes)

    async def get_all() -> list[int]:
        async with setup.aio_client() as client:
            limit = asyncio.Semaphore(inflight)

            async def get(name: str, first: int, last: int) -> int:
                async with limit:
                    response = await client.get_object(
                        Bucket=setup.bucket,
                        Key=f"{setup.s3_prefix('shardstream')}/{name}",
                        Range=f"bytes={first}-{last}",
                    )
                    async with response["Body"] as body:
                        if on_body is None:
                            size = 0
                            if wide_reads:
                                async for piece in aiohttp_pieces(body.raw_stream):
                                    if not size:
                                        mark_first(0, len(piece))
                                    size += len(piece)
                            else:
                                while chunk := await body.read(1 << 20):
                                    if not size:
                                        mark_first(0, len(chunk))
                                    size += len(chunk)
                            return size
                        pieces = []
                        async for piece in aiohttp_pieces(body.raw_stream):
                            if not pieces:
                                mark_steady()
                            pieces.append(piece)
                return on_body(name, first, pieces)

            return await asyncio.gather(*(get(*r) for r in ranges))

    return sum(asyncio.run(get_all()))


def s3_threaded_gets(
    setup: Setup,
    threads: int,
    range_bytes: int,
    on_body: Callable[[str, int, list[Any]], int] | None = None,
    *,
    fresh: bool = False,
) -> int:
    """The ranged GETs of :func:`s3_ranged_gets`, made by ``threads`` threads, each over one
    ``http.client`` connection with a presigned URL (botocore signs it), each body received
    straight into the thread's own buffer (``readinto``: the socket's bytes land in it with
    the GIL released, and no parser copies them again), then handed to ``on_body`` as a
    one-piece list of a memoryview of that buffer, or discarded. With ``fresh``, each body
    goes to a new anonymous memory map instead (slicing one gives ``bytes``), as a reader that
    holds parts until their samples are consumed must: its pages are faulted in anew. Not a
    reader shardstream has: it measures what a receive path of that kind would cost."""
    import http.client
    import mmap
    import queue
    import urllib.parse
    from concurrent.futures import ThreadPoolExecutor

    todo: queue.SimpleQueue = queue.SimpleQueue()
    for span in shard_ranges(setup, range_bytes):
        todo.put(span)
    client = setup.boto3_client()
    endpoint = urllib.parse.urlsplit(setup.endpoint_url)

    def work() -> int:
        conn = http.client.HTTPConnection(endpoint.hostname, endpoint.port)
        reused = None if fresh else memoryview(bytearray(range_bytes))
        total = 0
        while True:
            try:
                name, first, last = todo.get_nowait()
            except queue.Empty:
                break
            url = client.generate_presigned_url(
                "get_object", Params={"Bucket": setup.bucket, "Key": f"{setup.s3_prefix('shardstream')}/{name}"}
            )
            parts = urllib.parse.urlsplit(url)
            conn.request("GET", f"{parts.path}?{parts.query}", headers={"Range": f"bytes={first}-{last}"})
            response = conn.getresponse()
            want, got = last - first + 1, 0
            view = memoryview(mmap.mmap(-1, want)) if reused is None else reused[:want]
            while got < want and (n := response.readinto(view[got:])):
                if not got and on_body is None:
                    mark_first(0, n)
                elif not got:
                    mark_steady()
                got += n
            if response.status != 206 or got != want or response.read():
                raise RuntimeError(f"{name} bytes {first}-{last}: status {response.status}, {got} of {want} bytes")
            total += on_body(name, first, [view.obj if reused is None else view]) if on_body else got
        conn.close()
        return total

    with ThreadPoolExecutor(threads) as pool:  # result() raises a thread's error here
        return sum(f.result() for f in [pool.submit(work) for _ in range(threads)])


def read_s3_threads(setup: Setup, *, threads: int = 8, range_bytes: int = 16 << 20) -> Progress:
    """:func:`s3_threaded_gets`, bytes discarded."""
    yield 0, s3_threaded_gets(setup, threads, range_bytes), 0


def read_s3_limit(
    setup: Setup, *, inflight: int = 8, range_bytes: int = 16 << 20, wide_reads: bool = False
) -> Progress:
    """Concurrent ranged GETs of shardstream's shard objects, bytes discarded as they arrive."""
    yield 0, s3_ranged_gets(setup, inflight, range_bytes, wide_reads=wide_reads), 0


def keep_copier(
    index: Any, on_first: Callable[[int, int], None] | None = None, *, check_markers: bool = False
) -> tuple[Callable[[str, int, list[Any]], int], list[int]]:
    """The keep floor's work on each whole GET body: ``(copy_out, copied)``.
    ``copy_out(name, first, pieces)`` takes the body of a ranged GET of shard ``name`` (its
    first byte at ``first`` of the shard; the pieces as received, uncopied), copies every
    member lying wholly inside it out as ``bytes`` by the offsets of ``index`` (a
    :class:`~shardstream.DatasetIndex`, read by ``shardstream.open_index``) and touches each
    as :func:`touched` does (one byte of every 4 KiB; with ``check_markers``, a JPEG member's
    start and end markers too, as :func:`touched` checks every reader's samples); it adds the
    samples begun in the body, the bytes copied and the JPEGs without their markers to
    ``copied`` (``[samples, bytes, damaged]``) and returns the body's bytes. ``on_first(1, bytes)`` is
    called once, after the first member is copied: the first sample (start-up ends there).
    Members cut by a GET's boundary (about one a GET) are not copied. Shared with
    bench/http_read.py's keep floor."""
    import numpy as np

    shards = {index.shard_url(i).rsplit("/", 1)[1]: i for i in range(index.num_shards)}
    spans: dict[str, tuple[Any, ...]] = {}  # shard name: its members' payload starts and ends, ...
    copied = [0, 0, 0]  # samples, bytes, damaged JPEGs

    def spans_of(name: str) -> tuple[Any, ...]:
        """... each sample's first member and which members are JPEGs, from the shard's table,
        read when its first body is whole, as shardstream reads each shard's table when it
        reaches the shard: reading the tables is work per shard, not start-up (read all at
        construction, the 35 tables' 0.05 CPU-s over http, more from S3, fell before the split)."""
        found = spans.get(name)
        if found is None:
            table = index.table(shards[name])
            if not check_markers:
                images = np.zeros(table.num_members, bool)
            elif table.extensions is not None:  # the same members in every sample, in this order
                images = np.tile([ext == IMAGE_EXT for ext in table.extensions], table.num_samples)
            else:
                images = np.array([ext == IMAGE_EXT for ext in table.member_extensions], bool)
            found = spans[name] = (table.offsets, table.offsets + table.sizes, table.member_start, images)
        return found

    def copy_out(name: str, first: int, pieces: list[Any]) -> int:
        nonlocal on_first
        starts, ends, first_members, images = spans_of(name)
        lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        piece_ends = first + np.cumsum(lengths)
        piece_starts = piece_ends - lengths
        lo, hi = int(np.searchsorted(starts, first)), int(np.searchsorted(ends, piece_ends[-1], side="right"))
        where = np.searchsorted(piece_starts, starts[lo:hi], side="right") - 1
        for k, a, b, image in zip(where.tolist(), starts[lo:hi].tolist(), ends[lo:hi].tolist(), images[lo:hi].tolist()):
            at = a - int(piece_starts[k])
            if b <= piece_ends[k]:
                payload = bytes(pieces[k][at : at + b - a])
            else:  # cut between pieces: joined from as many as it spans
                parts, need = [pieces[k][at:]], b - int(piece_ends[k])
                while need > 0:
                    k += 1
                    parts.append(pieces[k][:need])
                    need -= len(parts[-1])
                payload = b"".join(parts)
            bytes(memoryview(payload)[::4096])
            copied[1] += len(payload)
            if image and (payload[:2] != b"\xff\xd8" or payload[-2:] != b"\xff\xd9"):
                copied[2] += 1
            if on_first is not None:
                on_first(1, len(payload))
                on_first = None
        copied[0] += int(np.searchsorted(first_members, hi) - np.searchsorted(first_members, lo))  # samples begun here
        return int(lengths.sum())

    return copy_out, copied


def read_s3_keep(setup: Setup, *, threaded: bool = False, fresh: bool = False) -> Progress:
    """The 8 x 16 MiB ranged GETs of ``s3-limit-2m`` (``threaded``: of ``s3-threads``; ``fresh``:
    each body in a new buffer), each body kept as received until it is whole, then every
    member lying wholly inside it copied out as ``bytes`` by the index's offsets and touched
    as :func:`touched` touches every reader's samples, JPEG markers checked too
    (:func:`keep_copier`): the least any reader does that hands out the samples' bytes (no
    header checks, no dicts, no second thread), the floor of shardstream's steady CPU per GB.
    Its first sample: the first member copied, once the first body is whole; its start-up's
    CPU ends at its first bytes (:func:`mark_steady`)."""
    from shardstream import open_index

    index = open_index(setup.s3_url("shardstream"), s3=setup.s3_config())  # from S3, as shardstream reads it
    copy_out, copied = keep_copier(index, mark_first, check_markers=True)
    if threaded:
        s3_threaded_gets(setup, 8, 16 << 20, copy_out, fresh=fresh)
    else:
        s3_ranged_gets(setup, 8, 16 << 20, copy_out, wide_reads=True)
    yield copied[0], copied[1], copied[2]
