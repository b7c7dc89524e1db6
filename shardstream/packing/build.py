"""``shardstream index build``: a shardstream index for tar shards someone else wrote.

WebDataset shards made by GNU tar, bsdtar, Python's tarfile or webdataset's ``TarWriter``
get the same index ``pack`` writes (``index.bin`` and a ``NAME.samples`` table beside each
shard), so exact epochs, ``len()``, resume, byte-range reads, the node cache, ``verify`` and
``index --dali`` work on them. No shard is copied or changed: each is read once, front to
back (in parallel, ``workers`` at a time), its members' offsets and sizes are recorded and
its CRC-32 computed as the bytes go by.

Samples are grouped as readers group them (consecutive members sharing a key, WebDataset's
rule, :mod:`shardstream.format`). Links, devices and FIFOs are left out of the tables with
a warning, as readers of other tools' shards skip them; the index marks the dataset as
built from foreign shards, so readers parsing a whole shard skip them too. Refused, naming
the shard: compressed shards (an index addresses bytes of a plain tar; decompress them, or
repack them with ``shardstream pack --from-shards``), sparse members, and a sample holding one extension
twice. The shards must lie in one directory or S3 prefix; the index is written there, or in
``output`` (then it records where the shards are). Rebuilding the index of a labelled dataset
keeps the class names (and per-class counts, when they still add up) of the index it replaces.

An unfinished pack's shards are refused (:func:`shardstream.index.status.unfinished_pack`): an
index over them would be taken for the whole dataset. ``partial`` indexes them all the same and
records in the index what is missing (:attr:`~shardstream.index.Manifest.partial`), which readers
and ``info`` print; the pack, run again, finishes and writes its own index. Tables, ``index.bin``
or ``keys/`` already there that no index or pack state records (another tool's, or a
build that was stopped) are refused unless ``overwrite`` (:mod:`.ownership`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..compression import compression_of
from ..config import RequestConfig, S3Config
from ..errors import CorruptShardError, DestinationError, IndexFormatError, ShardNotFoundError
from ..format import RESERVED_FIELDS, SHARD_SUFFIXES, split_key
from ..index import KEYS_DIR, MANIFEST_NAME, TABLE_SUFFIX, Manifest, TableSpool, write_with_keys
from ..index.status import unfinished_pack
from ..storage import Store, is_remote_url, open_store, pin_urls, split_url, write_pieces
from ..storage.fetch import iter_shard_streams
from ..tarstream import Hashed, iter_members_at
from .ownership import recorded_names, refuse_foreign
from .workers import can_fork

__all__ = ["build_index", "shard_urls_of"]

log = logging.getLogger("shardstream")


@dataclass(frozen=True)
class _Scanned:
    name: str
    size_bytes: int
    num_samples: int
    num_members: int
    crc32: int


def shard_urls_of(
    sources: Sequence[str], *, s3: S3Config | None = None, requests: RequestConfig | None = None
) -> list[str]:
    """The shard URLs ``sources`` name: shard paths or URLs, brace patterns, and directories
    or remote prefixes (every ``.tar`` file directly in them, in name order), ``hf://``
    revisions pinned to their commit; remote stores are asked under ``requests``.

    Raises:
        ShardNotFoundError: a directory or prefix holds no shard.
        ValueError: no source given.
    """
    if not sources:
        raise ValueError("give the shards to index: paths, s3:// URLs, brace patterns, or a directory or prefix")
    urls: list[str] = []
    for source in sources:
        text = os.fspath(source)
        if "{" in text:
            from braceexpand import braceexpand

            urls.extend(braceexpand(text))
        elif text.endswith(SHARD_SUFFIXES):
            urls.append(text if is_remote_url(text) else os.path.abspath(text))
        else:
            root = text.rstrip("/") if is_remote_url(text) else os.path.abspath(text)
            store = open_store(root, s3=s3, requests=requests)
            names = [n for n in store.list_names() if n.endswith(SHARD_SUFFIXES)]
            if not names:
                raise ShardNotFoundError(f"{store.url}: holds no .tar shard to index")
            urls.extend(store.url_of(n) for n in names)
    return pin_urls([u if is_remote_url(u) else os.path.abspath(u) for u in urls], requests=requests)


def build_index(
    sources: Sequence[str],
    *,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    workers: int = 4,
    overwrite: bool = False,
    output: str | None = None,
    on_shard: Callable[[str], None] | None = None,
    ray: str | None = None,
    partial: bool = False,
) -> Manifest:
    """Index existing shards (module doc): write each shard's table beside it, then
    ``index.bin``; or, with ``output``, all of it there, the shards untouched where they are
    (shards you cannot write to, such as a public bucket's).

    Args:
        sources: as :func:`shard_urls_of`; the shards keep this order in the index.
        s3: S3 endpoint and credentials for ``s3://`` shards.
        requests: timeouts, attempts and connections of the requests to remote stores (the
            shards' and the output's); default :class:`~shardstream.config.RequestConfig`
            (for S3: the S3Config's own fields).
        workers: shards scanned at once (processes; a scan is CPU-bound parsing).
        overwrite: replace an index already there, and tables or ``keys/`` there that no
            index or pack state records.
        output: a local directory or ``s3://`` prefix for the index and tables, which then
            records where the shards are (moving the shards breaks it; moving the index does not).
        on_shard: called with each shard's URL when it is done (a progress bar).
        ray: scan the shards in tasks on the Ray cluster at this address (``"auto"``, or
            ``RAY_ADDRESS``), batches of shards per task (:mod:`shardstream.packing.ray_run`);
            every node must reach the shards and the output by the same URL or path.
        partial: index the shards of an unfinished pack, recording in the index what is
            missing (module doc); without it they are refused.

    Returns:
        The manifest written.

    Raises:
        ValueError: the shards lie in more than one directory or prefix, or a name repeats.
        DestinationError: an index is already there, or tables or ``keys/`` that nothing there
            records (and not ``overwrite``); the shards are an unfinished pack's (and not
            ``partial``).
        CorruptShardError: a shard is compressed, damaged, or holds a sparse member or a
            sample with one extension twice (named).
        ShardNotFoundError, StorageError: a shard cannot be read.
    """
    urls = shard_urls_of(sources, s3=s3, requests=requests)
    root, names = _one_place(urls)
    if output is not None:
        output = output.rstrip("/") if is_remote_url(output) else os.path.abspath(output)
    store = open_store(output or root, s3=s3, requests=requests)
    if output is not None:
        store.check_writable()
    if store.exists(MANIFEST_NAME) and not overwrite:
        raise DestinationError(
            f"{store.url_of(MANIFEST_NAME)}: an index is already there; pass --overwrite to replace it"
        )
    shards_store = open_store(root, s3=s3, requests=requests) if output is not None else store
    note = _unfinished_note(shards_store, partial=partial)
    if not overwrite:
        writes = {n + TABLE_SUFFIX for n in names} | {MANIFEST_NAME}
        there = [n for n in store.list_names() if n in writes] + store.list_names(f"{KEYS_DIR}/")
        recorded = recorded_names(store) if there else set()
        refuse_foreign(store, sorted(set(there) - recorded), option="--overwrite", what="index build")
    classes = _classes_kept(store, shards_store if output is not None else None)
    scanned = _scan_all(
        urls, s3=s3, requests=requests, tables_url=store.url, workers=workers, ray=ray, on_shard=on_shard
    )
    manifest = _manifest(
        names,
        [scanned[u] for u in urls],
        classes,
        url=store.url_of(MANIFEST_NAME),
        note=note,
        shards_url=root if store.url != root else None,
    )
    write_with_keys(store, manifest)
    return manifest


def _manifest(
    names: list[str],
    rows: list[_Scanned],
    classes: tuple[list[str], list[int] | None] | None,
    *,
    url: str,
    note: str | None,
    shards_url: str | None,
) -> Manifest:
    """The index of the scanned shards ``rows`` (named ``names``), keeping the class names
    (and counts, where they still add up) of the index it replaces."""
    class_names, class_counts = classes or (None, None)
    num_samples = sum(r.num_samples for r in rows)
    if class_counts is not None and sum(class_counts) != num_samples:
        log.warning(
            "the index replaced counted %d samples in its classes, the shards hold %d: the new index keeps the "
            "class names without counts",
            sum(class_counts),
            num_samples,
        )
        class_counts = None
    return Manifest.from_columns(
        names=names,
        shard_bytes=[r.size_bytes for r in rows],
        shard_samples=[r.num_samples for r in rows],
        shard_members=[r.num_members for r in rows],
        crc32=np.array([r.crc32 for r in rows], np.uint32),
        url=url,
        foreign=True,
        shards_url=shards_url,
        classes=class_names,
        class_counts=class_counts,
        partial=note,
    )


def _one_place(urls: Sequence[str]) -> tuple[str, list[str]]:
    """The directory or prefix all ``urls`` lie in, and their names there.

    Raises:
        ValueError: they lie in more than one place, or a name repeats.
    """
    roots = {split_url(u)[0] for u in urls}
    if len(roots) != 1:
        raise ValueError(
            f"the shards lie in {len(roots)} places ({', '.join(sorted(roots)[:3])}, ...); an index "
            "sits beside its shards, in one directory or S3 prefix: index each place on its own"
        )
    names = [split_url(u)[1] for u in urls]
    if len(set(names)) != len(names):
        raise ValueError("a shard is named twice in the sources")
    return roots.pop(), names


def _scan_all(
    urls: Sequence[str],
    *,
    s3: S3Config | None,
    requests: RequestConfig | None,
    tables_url: str,
    workers: int,
    ray: str | None,
    on_shard: Callable[[str], None] | None,
) -> dict[str, _Scanned]:
    """Each shard's scan (its table written under ``tables_url``), by URL: on the Ray cluster
    at ``ray``, in this process (``workers`` <= 1), or in ``workers`` processes (forked for
    local shards where :func:`.workers.can_fork`, else spawned); ``on_shard`` told of each as it
    is done."""
    scanned: dict[str, _Scanned] = {}
    if ray is not None:
        from .ray_run import cluster_cpus, connect, map_on_ray

        connect(None if ray == "auto" else ray)
        cpus = cluster_cpus()
        batch = max(1, min(256, len(urls) // (4 * cpus)))
        scan = functools.partial(_scan, s3=s3, tables_url=tables_url, requests=requests)
        for url, result in map_on_ray(scan, urls, batch_size=batch, max_in_flight=2 * cpus, what="index build"):
            scanned[url] = result
            if on_shard is not None:
                on_shard(url)
    elif workers <= 1 or len(urls) == 1:
        for url in urls:
            scanned[url] = _scan(url, s3, tables_url, requests)
            if on_shard is not None:
                on_shard(url)
    else:
        import multiprocessing

        # local shards: fork where it is safe (nothing imported again); S3: spawn, as this process
        # runs the S3 event loop's thread, which a fork would copy mid-flight; so does any other
        # thread (workers.can_fork). Call from under ``if __name__ == "__main__":``, as spawn needs.
        local = not any(map(is_remote_url, urls))
        context = multiprocessing.get_context("fork" if local and can_fork() else "spawn")
        with concurrent.futures.ProcessPoolExecutor(min(workers, len(urls)), mp_context=context) as pool:
            futures = {pool.submit(_scan, url, s3, tables_url, requests): url for url in urls}
            for future in concurrent.futures.as_completed(futures):
                scanned[futures[future]] = future.result()
                if on_shard is not None:
                    on_shard(futures[future])
    return scanned


def _unfinished_note(store: Store, *, partial: bool) -> str | None:
    """What an index of the shards at ``store`` misses when an unfinished pack wrote them
    (:func:`~shardstream.index.status.unfinished_pack`), for ``partial``; None when none did.

    Raises:
        DestinationError: they are an unfinished pack's, and not ``partial``.
    """
    manifest = None
    if store.exists(MANIFEST_NAME):
        try:
            manifest = Manifest.parse(store.read_bytes(MANIFEST_NAME), url=store.url_of(MANIFEST_NAME))
        except IndexFormatError:
            manifest = None
    status = unfinished_pack(store, manifest)
    if status is None or status.complete:
        return None
    if not partial:
        raise DestinationError(
            f"{status.describe()}; an index of its shards now would be taken for the whole dataset: pass "
            f"--partial to index the {status.progress()} all the same (the index then says it is partial)"
        )
    return f"indexes {status.what()}: {status.fix()}"


def _classes_kept(*stores: Store | None) -> tuple[list[str], list[int] | None] | None:
    """The classes (and per-class counts) of the index ``index build`` replaces: the first of
    ``stores`` that holds an index recording them; None when none does."""
    for store in stores:
        if store is None:
            continue
        try:
            old = Manifest.parse(store.read_bytes(MANIFEST_NAME), url=store.url_of(MANIFEST_NAME))
        except (FileNotFoundError, IndexFormatError):
            continue  # no index there, or one that cannot be read: it is replaced
        if old.classes is not None:
            return old.classes, old.class_counts
    return None


def _scan(url: str, s3: S3Config | None, tables_url: str, requests: RequestConfig | None = None) -> _Scanned:
    """Read one shard front to back: write its table under ``tables_url``; its size, counts
    and CRC-32."""
    _, name = split_url(url)
    store = open_store(tables_url, s3=s3, requests=requests)
    spool = TableSpool(name)
    try:
        for _, stream in iter_shard_streams([url], s3=s3, requests=requests):
            hashed = Hashed(stream)
            members = iter_members_at(hashed, url=url, foreign=True, payloads=False)
            first = next(members, None)  # the first bytes are in: is it compressed?
            if compression_of(hashed.head) is not None:
                raise CorruptShardError(
                    f"{url}: a compressed shard; an index addresses the bytes of a plain tar, so decompress it "
                    "first (gunzip, zstd -d) or repack it with shardstream pack --from-shards"
                )
            key: str | None = None
            samples: list[tuple[str, int, int]] = []
            exts: set[str] = set()
            for member, offset, payload_size in itertools.chain([first] if first else [], members):
                sample_key, ext = split_key(member)
                if ext in RESERVED_FIELDS:
                    raise CorruptShardError(f"{url}: member {member!r} uses reserved extension {ext!r}")
                if sample_key != key:
                    if key is not None:
                        spool.add(key, samples)
                    key, samples, exts = sample_key, [], set()
                elif ext in exts:
                    raise CorruptShardError(
                        f"{url}: sample {key!r} holds extension {ext!r} twice; readers would "
                        "lose one of them: repack the shard"
                    )
                exts.add(ext)
                samples.append((member, offset, payload_size))
            if key is not None:
                spool.add(key, samples)
            hashed.drain()
            size, crc = hashed.nbytes, hashed.crc32
        if spool.num_samples == 0:
            raise CorruptShardError(f"{url}: holds no regular file; nothing to index")
        write_pieces(store, name + TABLE_SUFFIX, spool.pieces())
        return _Scanned(name, size, spool.num_samples, spool.num_members, crc)
    finally:
        spool.close()
