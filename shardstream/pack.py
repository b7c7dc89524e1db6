"""``pack(source, dest)``: a directory of small files -> tar shards plus ``index.json``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from dataclasses import dataclass

from tqdm import tqdm

from .config import FetchConfig, S3Config
from .errors import DestinationError, IndexFormatError, MemberNameError, SourceError, UnreadableFileError
from .format import check_member_name, split_key
from .index import INDEX_NAME, Index
from .sources import Problem, ProblemKind, Sample, check_source, walk_samples
from .storage import LocalStore, Store, open_store
from .writer import ShardWriter

__all__ = ["PackReport", "pack"]

DEFAULT_MAX_SHARD_BYTES = 256 << 20


@dataclass(frozen=True, kw_only=True)
class PackReport:
    """What :func:`pack` did. Sizes are bytes, times seconds.

    Attributes:
        index_url: where the index was written.
        num_files, num_samples, num_shards: counts packed.
        payload_bytes: bytes of the packed files; shard_bytes: bytes of the shards written.
        seconds: wall time.
        problems: every entry under the source that was not packed, and why.
    """

    index_url: str
    num_files: int
    num_samples: int
    num_shards: int
    payload_bytes: int
    shard_bytes: int
    seconds: float
    problems: tuple[Problem, ...]

    def summary(self) -> str:
        """One line: counts, sizes and speed."""
        seconds = max(self.seconds, 1e-9)
        line = (
            f"packed {self.num_files} files ({self.num_samples} samples, "
            f"{self.payload_bytes / 1e6:.1f} MB) into {self.num_shards} shards "
            f"({self.shard_bytes / 1e6:.1f} MB) in {self.seconds:.1f} s: "
            f"{self.num_files / seconds:.0f} files/s, {self.payload_bytes / 1e6 / seconds:.1f} MB/s; "
            f"index {self.index_url}"
        )
        if self.problems:
            line += f"; {len(self.problems)} entries not packed (listed above)"
        return line


def pack(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    name: str = "data",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    max_samples_per_shard: int | None = None,
    skip_unreadable: bool = False,
    overwrite: bool = False,
    s3: S3Config | None = None,
    fetch: FetchConfig | None = None,
    progress: bool = True,
) -> PackReport:
    """Pack every regular file under ``source`` into tar shards and an index at ``dest``.

    Members are named by their path relative to ``source`` and grouped into samples by key
    (:mod:`shardstream.format`). Shards go to ``dest/<name>-NNNNNN.tar``; ``dest/index.json``
    (:mod:`shardstream.index`) is written last. If pack fails, the shards it wrote are
    deleted and no index is written.

    Args:
        source: a local directory.
        dest: a local directory (created if needed) or ``s3://bucket/prefix``.
        name: shard name prefix.
        max_shard_bytes: shard size limit in bytes (exceeded only by a single larger sample).
        max_samples_per_shard: sample limit per shard, or None.
        skip_unreadable: pack the rest when a file cannot be read, and report it; by
            default the first unreadable file stops the pack.
        overwrite: replace a dataset already at ``dest``: its index is deleted first and its
            shards are replaced or deleted; if this pack fails, ``dest`` holds no dataset.
        s3: endpoint and credentials for ``s3://`` destinations.
        fetch: multipart part size and concurrency for ``s3://`` destinations.
        progress: show a tqdm bar on stderr.

    Returns:
        A :class:`PackReport`; ``report.problems`` lists entries not packed (FIFOs, sockets,
        devices, symlinks to directories, and with ``skip_unreadable`` unreadable files).

    Raises:
        SourceNotFoundError, SourceError: ``source`` is missing, not a directory, or holds
            no regular file.
        UnreadableFileError: a file cannot be read (without ``skip_unreadable``).
        MemberNameError: a file name cannot be a member name (not UTF-8, a line break, a
            reserved extension, or two files of one sample with the same extension).
        DestinationError: ``dest`` cannot be written, lies inside ``source``, or holds a
            dataset and not ``overwrite``.
        BucketNotFoundError, StorageAccessError, StorageConnectionError: S3 problems.
    """
    started = time.perf_counter()
    root = check_source(source)
    store = open_store(dest, s3=s3, fetch=fetch)
    writer = ShardWriter(store, name=name, max_shard_bytes=max_shard_bytes, max_samples_per_shard=max_samples_per_shard)
    created_dir = None
    if isinstance(store, LocalStore):
        if store.root == Path(root) or Path(root) in store.root.parents:
            raise DestinationError(
                f"{store.root} is inside SOURCE {root}, so pack would pack its own shards; "
                "pick a DEST outside SOURCE"
            )
        created_dir = None if store.root.exists() else store.root
    store.check_writable()
    old_index = _take_existing_index(store, overwrite=overwrite)
    problems: list[Problem] = []

    def on_problem(problem: Problem) -> None:
        if problem.kind is ProblemKind.UNREADABLE and not skip_unreadable:
            raise UnreadableFileError(
                f"{problem.path}: {problem.reason}; fix its permissions or remove it, or pass "
                "--skip-unreadable to pack the rest"
            )
        problems.append(problem)
        tqdm.write(f"not packed: {problem.path}: {problem.reason}", file=sys.stderr)

    num_files = payload_bytes = postfix_at = 0
    bar = tqdm(unit="file", unit_scale=True, desc="packing", disable=not progress, file=sys.stderr, mininterval=0.5)
    try:
        for sample in walk_samples(root, on_problem=on_problem):
            members = _read_sample(sample, on_problem)
            if not members:
                continue
            writer.write_sample(sample.key, members)
            num_files += len(members)
            payload_bytes += sum(len(p) for _, p in members)
            bar.update(len(members))
            if bar.n - postfix_at >= 256:
                postfix_at = bar.n
                bar.set_postfix_str(f"{payload_bytes / 1e6 / max(bar.format_dict['elapsed'], 1e-9):.1f} MB/s", refresh=False)
        shards = writer.close()
        if not shards:
            raise SourceError(f"{root}: holds no regular file to pack (check SOURCE)")
        index = Index(shards=tuple(shards))
        store.write_bytes(INDEX_NAME, index.to_json())
    except BaseException:
        writer.abort()
        if old_index is not None:  # its index is gone already: leave no orphaned shards
            for stale in old_index.shards:
                store.delete(stale.name)
        if created_dir is not None:
            try:
                created_dir.rmdir()  # only if empty
            except OSError:
                pass
        raise
    finally:
        bar.close()
    if old_index is not None:
        written = {s.name for s in shards}
        for stale in old_index.shards:
            if stale.name not in written:
                store.delete(stale.name)
    return PackReport(
        index_url=store.url_of(INDEX_NAME),
        num_files=num_files,
        num_samples=index.num_samples,
        num_shards=index.num_shards,
        payload_bytes=payload_bytes,
        shard_bytes=index.total_bytes,
        seconds=time.perf_counter() - started,
        problems=tuple(problems),
    )


def _take_existing_index(store: Store, *, overwrite: bool) -> Index | None:
    """Refuse to pack over a dataset unless ``overwrite``; then delete its index (its shards
    are about to be replaced, so it must not outlive them) and return it, if it parses."""
    if not store.exists(INDEX_NAME):
        return None
    if not overwrite:
        raise DestinationError(
            f"{store.url_of(INDEX_NAME)} exists: DEST already holds a dataset; pass --overwrite "
            "to replace it, or pick another DEST"
        )
    try:
        old = Index.from_json(store.read_bytes(INDEX_NAME), url=store.url_of(INDEX_NAME))
    except IndexFormatError:
        old = None
    store.delete(INDEX_NAME)
    return old


def _read_sample(sample: Sample, on_problem: Callable[[Problem], None]) -> list[tuple[str, bytes]]:
    """The sample's ``(member_name, payload)`` pairs; unreadable files go to ``on_problem``."""
    members = []
    paths_by_ext: dict[str, str] = {}
    for file in sample.files:
        check_member_name(file.member_name, where=file.path)
        ext = split_key(file.member_name)[1]
        if ext in paths_by_ext:  # "a" and "a." both give key "a", extension ""
            raise MemberNameError(
                f"{paths_by_ext[ext]!r} and {file.path!r} would both be extension {ext!r} of "
                f"sample {sample.key!r}; rename one of them"
            )
        paths_by_ext[ext] = file.path
        try:
            with open(file.path, "rb") as f:
                payload = f.read()
        except OSError as exc:
            on_problem(Problem(file.path, ProblemKind.UNREADABLE, f"cannot read: {exc.strerror or exc}"))
            continue
        if len(payload) != file.size:
            on_problem(
                Problem(file.path, ProblemKind.UNREADABLE, f"changed size while packing ({file.size} -> {len(payload)} bytes)")
            )
            continue
        members.append((file.member_name, payload))
    return members
