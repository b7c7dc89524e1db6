"""``pack(source, dest)``: small files -> tar shards plus an index, in parallel,
resumable after a crash, and split across machines (see :mod:`shardstream.packing.journal`)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence

from tqdm import tqdm

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import ShardstreamError, SourceError
from ..index import open_index
from ..storage import Store, is_remote_url
from .destination import (
    DEFAULT_MAX_SHARD_BYTES,
    PackReport,
    check_options,
    check_outside,
    merge_when_done,
    open_destination,
    prepare_state,
)
from .destination import wipe as wipe  # its old home, for older imports (as the names above)
from .journal import PackSpec
from .labels import input_classes, write_classes
from .listing import Listing, ensure_listing, read_label_bytes
from .parts import Part, part_and_workers
from .sources import Problem, check_source
from .stream import OnError, StreamJob, StreamResult, check_problem, run_stream
from .workers import Workers

__all__ = ["OnError", "PackReport", "Part", "pack"]

DEFAULT_SHUFFLE_BUFFER = 100_000


def pack(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    name: str = "data",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    max_samples_per_shard: int | None = None,
    files_from: str | os.PathLike[str] | None = None,
    on_error: OnError | str = OnError.FAIL,
    workers: int | None = 1,
    part: Part | None = None,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    overwrite: bool = False,
    clobber: bool = False,
    s3: S3Config | None = None,
    requests: RequestConfig | None = None,
    fetch: FetchConfig | None = None,
    progress: bool = True,
    from_shards: bool = False,
    ray: str | None = None,
    labels_from_dirs: bool = False,
    check_images: bool = False,
    labels_from: str | os.PathLike[str] | None = None,
    classes: Sequence[str] | None = None,
    classes_from: str | os.PathLike[str] | None = None,
) -> PackReport:
    """Pack every file of ``source`` into tar shards and an index at ``dest``.

    Members are named by their path relative to ``source`` and grouped into samples by key
    (:mod:`shardstream.format`; files of one key that differ only by an extra dot part, such as
    ``a.JPEG`` and ``a.b.JPEG``, become one sample and are reported), or, with
    ``labels_from_dirs``, each file is a sample labelled by its class folder
    (:mod:`shardstream.packing.labels`). Shards are published one by one as they complete;
    ``dest/index.bin`` (:mod:`shardstream.index`) is written last, once every part is done; each
    shard's sample table (``NAME.samples``) is published with it.
    Run the same call again after a crash (or a failure on a bad file) and it continues where
    it stopped (:mod:`shardstream.packing.journal`).

    Args:
        source: a local directory, or an ``s3://bucket/prefix`` of files.
        dest: a local directory (created if needed) or ``s3://bucket/prefix``.
        name: shard name prefix: ``<name>-NNNNNN.tar``.
        max_shard_bytes: shard size limit in bytes (exceeded only by a single larger sample).
        max_samples_per_shard: sample limit per shard, or None.
        files_from: a file listing the paths to pack, relative to ``source`` (newline- or
            NUL-separated; ``"-"`` reads standard input); the list's order is kept.
        on_error: ``"raise"`` (or ``"fail"``, its older word, the default) stops at the first bad
            input file, naming it; ``"skip"`` packs the rest and lists each skipped file in
            ``dest/pack-report.jsonl``.
        workers: processes writing shards in parallel (None: the CPU count, the CLI's default;
            the default here, 1, writes in this process), forked on Linux where this process
            runs no other Python thread (the CLI), else spawned: a script calling
            ``pack(workers > 1)`` needs the usual ``if __name__ == "__main__":`` guard.
            All parts of one pack must use the same number.
        part: pack only this part of the input (another machine packs the others); default
            from ``RANK`` / ``WORLD_SIZE`` (torchrun) or a job array, else the whole input.
        shuffle: spread samples over shards in a random order seeded by ``seed``, through a
            buffer of ``shuffle_buffer`` samples' names (not contents).
        overwrite: replace a dataset (or an unfinished pack) already at ``dest``: delete what
            its index and pack state record (shards, tables, ``index.bin``, ``keys/``, the
            report, ``.shardstream/``), nothing else; the report lists what was kept.
        clobber: write over files at ``dest`` that have the names this pack writes (its shards
            and tables, ``index.bin``, ``keys/``, the report, ``.shardstream/``) though no index
            or pack state there records them, such as another tool's ``data-000000.tar``;
            without it such a ``dest`` is refused, naming them. Other files are never touched.
        s3: endpoint and credentials for ``s3://`` sources and destinations.
        requests: timeouts, attempts and connections of requests to remote sources and
            destinations (:class:`~shardstream.config.RequestConfig`; None: its defaults).
        fetch: multipart part size and concurrency for ``s3://`` destinations.
        progress: show a tqdm bar on stderr.
        from_shards: ``source`` is tar shards (a directory or S3 prefix of ``.tar`` files,
            ``.tar.gz`` and ``.tar.zst`` too, a shard or a brace pattern), any tool's: each of
            their samples becomes a sample of the output, same keys and bytes, streamed
            through without extracting (to change the shard size, shuffle, decompress, or
            merge small shards). Input shard ``i`` is read by stream ``i mod (parts x
            workers)``; resume, parts and the report work as for files. Samples are grouped
            as readers group them; links in the input are skipped with a warning.
        ray: run the streams as tasks on the Ray cluster at this address (``"auto"``: the one
            started on this machine, or ``RAY_ADDRESS``), ``workers`` of them (pass
            ``workers=None`` for the cluster's CPU count; the CLI's default); this process
            lists the source and writes the index
            (:mod:`shardstream.packing.ray_run`). SOURCE and DEST must be reachable from every node.
        labels_from_dirs: ``source`` is a tree of class folders (torchvision's ``ImageFolder``
            layout): each file is a sample of its own, keyed by its path without the last suffix,
            its member named by that suffix lower-cased, with a ``cls`` member holding its class
            index (the position of its top-level folder among the sorted folder names) and a
            ``json`` member from a ``metadata.jsonl`` / ``metadata.csv`` row (Hugging Face's
            ``imagefolder`` convention); the index records the class names and per-class counts
            (:mod:`shardstream.packing.labels`). Not with ``files_from`` or ``from_shards`` (a
            reshard keeps its input's classes by itself).
        labels_from: a labels file (CSV with a header, or JSON Lines): each row names a file
            (relative to ``source``; column ``file_name`` or ``filename``) and its label
            (column ``label``), as Hugging Face's ``metadata.csv`` does
            (:mod:`shardstream.packing.label_file`). Each file is a sample labelled as
            ``labels_from_dirs`` labels it (``cls`` member, classes in the index), but from its
            row, so the files may lie in one flat folder (an ImageNet-style validation set). A
            file without a row, and a row without a file, are problems under ``on_error``.
        classes: the class list, in class-index order, for ``labels_from_dirs`` or
            ``labels_from`` (default: the sorted folder names, or the sorted labels): a
            validation set missing a class keeps the training set's indices; a folder or label
            not in the list is a problem under ``on_error`` (``UNKNOWN_CLASS``), named.
        classes_from: take ``classes`` from the index of this dataset (a directory or URL, e.g.
            the training set's).
        check_images: decode every image member (by extension: jpg, png, webp, ...) with Pillow
            while packing; one that does not decode is a problem under ``on_error`` (its sample
            is left out under ``"skip"``). Costs a decode per image, on the reading threads.

    Returns:
        A :class:`PackReport`.

    Raises:
        SourceNotFoundError, SourceError: ``source`` is missing, not a directory, or holds no file.
        UnreadableFileError, MemberNameError: a bad input file with ``on_error="raise"``.
        DecodeError: with ``check_images`` and ``on_error="raise"``, an image that does not decode.
        SourceError: with ``labels_from_dirs`` or ``labels_from`` and ``on_error="raise"``, a file
            in no class folder (or without a row), a label not among ``classes``, or a metadata
            or labels file (or row) that cannot be used; ``classes_from`` records no classes.
        DestinationError: ``dest`` cannot be written, lies inside ``source``, holds a dataset
            and not ``overwrite``, holds an unfinished pack made with other settings, or holds
            files with the names the pack writes that no index or pack state there records
            (and not ``clobber``).
        BucketNotFoundError, StorageAccessError, StorageConnectionError: S3 problems.
    """
    started = time.perf_counter()
    on_error = OnError(on_error)
    part, workers = part_and_workers(part, workers, ray=ray, overwrite=overwrite)
    if workers < 1:
        raise ValueError(f"{workers=} must be >= 1")
    if shuffle_buffer < 1:
        raise ValueError(f"{shuffle_buffer=} must be >= 1 (sample names)")
    check_options(name, max_shard_bytes, max_samples_per_shard)
    if labels_from_dirs and from_shards:
        raise ValueError(
            "--labels-from-dirs labels the files of a tree of class folders; --from-shards repacks shards and "
            "keeps the classes their index records: give one of them"
        )
    labels_path, pinned = _labels_options(
        labels_from, classes, classes_from, labels_from_dirs=labels_from_dirs, s3=s3, requests=requests
    )
    if labels_path is not None and from_shards:
        raise ValueError("--labels-from and --classes label files; --from-shards keeps the classes of its input")
    if labels_path is not None and files_from is not None:
        raise ValueError("--labels-from takes its files from a walk of SOURCE; it does not take --files-from")
    if labels_from_dirs and files_from is not None:
        raise ValueError(
            "--labels-from-dirs takes its classes from a walk of SOURCE's folders; it does not take --files-from "
            "(pack a folder holding only the files to pack)"
        )
    if from_shards:
        from .build import shard_urls_of

        text = os.fspath(source)
        source_url = text.rstrip("/") if is_remote_url(text) or "{" in text else os.path.abspath(text)
        if files_from is not None:
            raise ValueError("--files-from lists files; with --from-shards SOURCE names the shards")
        shard_urls_of([source_url], s3=s3, requests=requests)  # the shards are there (raises naming SOURCE if not)
    else:
        source_url = os.fspath(source).rstrip("/") if is_remote_url(os.fspath(source)) else check_source(source)
    if files_from is not None and is_remote_url(source_url):
        raise ValueError("--files-from takes a local SOURCE directory")
    store = open_destination(dest, s3=s3, fetch=fetch, requests=requests)
    check_outside(store, source_url)
    spec = PackSpec(
        source=source_url,
        files_from=files_from is not None,
        name=name,
        max_shard_bytes=max_shard_bytes,
        max_samples_per_shard=max_samples_per_shard,
        num_parts=part.count,
        workers=workers,
        shuffle=shuffle,
        seed=seed,
        from_shards=from_shards,
        listed=not from_shards,
        labels_from_dirs=labels_from_dirs,
        check_images=check_images,
        labels_from=labels_path,
        classes=pinned,
    )
    claim = prepare_state(store, spec, overwrite=overwrite, clobber=clobber)
    if claim.complete:
        return PackReport.nothing_to_do(store, started=started)
    if from_shards:  # a reshard of a labelled dataset keeps its classes
        classes = input_classes(source_url, s3=s3, requests=requests)
        if classes is not None:
            write_classes(store, *classes)

    listed_problems: list[Problem] = []
    with _spooled_list(files_from) as list_path:
        jobs = [
            StreamJob(
                spec=spec,
                stream=stream,
                dest=store.url,
                list_path=list_path,
                on_error=on_error,
                shuffle_buffer=shuffle_buffer,
                s3=s3,
                fetch=fetch,
                requests=requests,
            )
            for stream in spec.streams_of_part(part.index)
        ]
        # worker processes start (forked, or spawned and importing) while the listing is made; they run once it is
        workers = None
        if ray is None and len(jobs) > 1:
            workers = Workers(jobs, run_stream, error=_worker_error, fork_if_alone=True)
        try:
            total_files = None
            if spec.listed:
                listing = list_once(
                    store,
                    spec,
                    list_path=list_path,
                    on_error=on_error,
                    shuffle_buffer=shuffle_buffer,
                    s3=s3,
                    requests=requests,
                    found=listed_problems,
                )
                total_files = sum(
                    listing.files_in(*listing.shard_range(s, spec.num_streams))
                    for s in spec.streams_of_part(part.index)
                )
            if ray is not None:
                from .ray_run import run_streams_on_ray

                results = run_streams_on_ray(jobs, run_stream, progress=progress, total_files=total_files)
            else:
                results = _run_jobs(jobs, progress=progress, total_files=total_files, workers=workers)
        finally:
            if workers is not None:
                workers.kill()  # where they did not finish (they have exited where they did)

    problems = (*listed_problems, *(p for r in results for p in r.problems))
    listed = " and --files-from" if files_from else ""
    totals = merge_when_done(store, spec, empty=f"{source_url}: holds no file to pack (check SOURCE{listed})")
    return PackReport.of(
        store,
        totals,
        started=started,
        num_files=sum(r.num_files for r in results),
        num_samples=sum(r.num_samples for r in results),
        num_shards=sum(r.num_shards for r in results),
        payload_bytes=sum(r.payload_bytes for r in results),
        resumed=any(r.resumed for r in results),
        problems=problems,
        kept=claim.kept,
    )


def _labels_options(
    labels_from: str | os.PathLike[str] | None,
    classes: Sequence[str] | None,
    classes_from: str | os.PathLike[str] | None,
    *,
    labels_from_dirs: bool,
    s3: S3Config | None,
    requests: RequestConfig | None,
) -> tuple[str | None, tuple[str, ...] | None]:
    """The labels file (absolute path or URL) and the pinned class list of
    :func:`pack`'s options, checked.

    Raises:
        ValueError: options that do not go together, or a bad class list.
        SourceNotFoundError: no labels file there.
        SourceError: ``classes_from`` records no classes.
    """
    if labels_from is not None and labels_from_dirs:
        raise ValueError("give --labels-from-dirs (labels from class folders) or --labels-from FILE, not both")
    if classes is not None and classes_from is not None:
        raise ValueError("give --classes or --classes-from, not both")
    if (classes is not None or classes_from is not None) and labels_from is None and not labels_from_dirs:
        raise ValueError("--classes and --classes-from pin the class list of --labels-from-dirs or --labels-from")
    path = None
    if labels_from is not None:
        text = os.fspath(labels_from)
        path = text if is_remote_url(text) else os.path.abspath(text)
        read_label_bytes(path, s3=s3, requests=requests)  # there, or SourceNotFoundError naming it
    if classes_from is not None:
        text = os.fspath(classes_from)
        index = open_index(text if is_remote_url(text) else os.path.abspath(text), s3=s3, requests=requests)
        if index.manifest.classes is None:
            raise SourceError(
                f"{index.manifest.url} records no classes (not a labelled dataset); give the training set packed "
                "with --labels-from-dirs or --labels-from, or --classes"
            )
        classes = index.manifest.classes
    if classes is not None:
        classes = tuple(str(c) for c in classes)
        if not classes or len(set(classes)) != len(classes) or any(not c or "\n" in c for c in classes):
            raise ValueError(f"classes must be distinct, non-empty names without line breaks; got {list(classes)[:5]}")
    return path, classes


def list_once(
    store: Store,
    spec: PackSpec,
    *,
    list_path: str | None,
    on_error: OnError,
    shuffle_buffer: int,
    s3: S3Config | None,
    requests: RequestConfig | None = None,
    found: list[Problem] | None = None,
) -> Listing:
    """The pack's listing (:mod:`shardstream.packing.listing`), made here unless another part
    made or is making it; ``found`` collects the problems when this process lists.

    Raises:
        UnreadableFileError, MemberNameError: a bad entry under ``on_error="raise"``.
    """

    def on_problem(problem: Problem) -> None:
        check_problem(problem, on_error)
        if found is not None:
            found.append(problem)

    return ensure_listing(
        store,
        spec,
        list_path=list_path,
        on_problem=on_problem,
        shuffle_samples=shuffle_buffer,
        s3=s3,
        requests=requests,
    )


class _spooled_list:
    """``--files-from -``: copy standard input to a temporary file every worker can read."""

    def __init__(self, files_from: str | os.PathLike[str] | None) -> None:
        self.files_from = None if files_from is None else os.fspath(files_from)
        self.tmp: str | None = None

    def __enter__(self) -> str | None:
        if self.files_from != "-":
            return self.files_from
        fd, self.tmp = tempfile.mkstemp(prefix="shardstream-files-from-")
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out)
        return self.tmp

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            os.unlink(self.tmp)


def _run_jobs(
    jobs: list[StreamJob], *, progress: bool, total_files: int | None = None, workers: Workers | None = None
) -> list[StreamResult]:
    """Run streams inline (one) or in worker processes (``workers``, started already),
    driving one progress bar."""
    bar = tqdm(
        unit=" files",
        unit_scale=True,
        desc="packing",
        disable=not progress,
        file=sys.stderr,
        mininterval=0.5,
        total=total_files,
    )
    payload = 0
    shown_at = 0.0

    def advance(files: int, nbytes: int) -> None:
        nonlocal payload, shown_at
        payload += nbytes
        bar.update(files)
        if time.monotonic() - shown_at > 0.5:
            shown_at = time.monotonic()
            bar.set_postfix_str(f"{payload / 1e6 / max(bar.format_dict['elapsed'], 1e-9):.1f} MB/s", refresh=False)

    try:
        if workers is None:
            return [run_stream(job, advance) for job in jobs]
        return workers.run(advance, name="pack")
    finally:
        if sys.exc_info()[0] is None:  # done: the total was the listing's estimate (skipped files never count)
            bar.total = bar.n
        bar.close()


def _worker_error(exc: BaseException, stream: int) -> BaseException:
    """A pack worker's error as the parent raises it: ours as it is, any other named by its stream."""
    return exc if isinstance(exc, ShardstreamError) else ShardstreamError(f"stream {stream}: {exc!r}")
