"""The destination every writer shares: ``pack``, :class:`shardstream.ShardWriter`,
:func:`shardstream.pack_samples` and the Ray datasink (:mod:`shardstream.packing.ray_sink`)
check their options here (:func:`check_options`), open ``dest`` (:func:`open_destination`),
check what it holds and claim it (:func:`prepare_state`, or :func:`check_destination` and
:func:`wipe` for the datasink, which keeps no pack state), write the index once every part is
done (:func:`merge_when_done`), and say what they did (:class:`PackReport`). Each shard is
published by :class:`shardstream.packing.writer.RotatingTarWriter`, for all of them."""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import DestinationError, IndexFormatError, SourceError
from ..index import INDEX_NAME, KEYS_DIR, MANIFEST_NAME, TABLE_SUFFIX, Index, Manifest
from ..storage import LocalStore, Store, is_remote_url, open_store
from .journal import REPORT_NAME, SPEC_NAME, STATE_DIR, PackSpec, merge, unfinished_streams
from .sources import Problem, ProblemKind
from .writer import ShardLimits

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "PackReport",
    "check_destination",
    "check_options",
    "check_outside",
    "index_totals",
    "merge_when_done",
    "open_destination",
    "prepare_state",
    "problem_notes",
    "wipe",
]

DEFAULT_MAX_SHARD_BYTES = 256 << 20


@dataclass(frozen=True, kw_only=True)
class PackReport:
    """What :func:`pack` did. Sizes are bytes, times seconds.

    Attributes:
        dest: the destination URL.
        index_url: where the index is, or None while other parts are unfinished.
        num_files, num_samples, payload_bytes: what this run read and packed (``num_files``
            counts inputs for :func:`pack_samples`, samples for :class:`ShardWriter`).
        num_shards: shards this run published.
        resumed: True when this run continued an earlier, interrupted one.
        seconds: wall time.
        problems: entries this run did not pack (or packed with a warning), and why.
        dataset_totals: the index totals when this run wrote the index.
    """

    dest: str
    index_url: str | None
    num_files: int
    num_samples: int
    num_shards: int
    payload_bytes: int
    resumed: bool
    seconds: float
    problems: tuple[Problem, ...]
    dataset_totals: dict[str, int] | None = None
    already_complete: bool = False
    unit: str = "files"  # what num_files counts: "files", "inputs" (pack_samples), "samples" (ShardWriter)

    @classmethod
    def of(cls, store: Store, totals: dict[str, int] | None, *, started: float, **counts: Any) -> PackReport:
        """The report of a run on ``store`` begun at ``started`` (``time.perf_counter()``),
        with the index's ``totals`` when it wrote the index (else None)."""
        return cls(
            dest=store.url,
            index_url=store.url_of(MANIFEST_NAME) if totals else None,
            seconds=time.perf_counter() - started,
            dataset_totals=totals,
            **counts,
        )

    @classmethod
    def nothing_to_do(cls, store: Store, *, started: float, unit: str = "files") -> PackReport:
        """The report of a run that found ``store`` already holding its finished result."""
        return cls.of(
            store,
            index_totals(store),
            started=started,
            num_files=0,
            num_samples=0,
            num_shards=0,
            payload_bytes=0,
            resumed=True,
            problems=(),
            already_complete=True,
            unit=unit,
        )

    def summary(self) -> str:
        """One line: counts, sizes, speed, and where the index is."""
        if self.already_complete and self.dataset_totals is not None:
            t = self.dataset_totals
            return (
                f"nothing to do: {self.dest} already holds this pack; index {self.index_url}: "
                f"{t['num_shards']} shards, {t['num_samples']} samples"
            )
        seconds = max(self.seconds, 1e-9)
        megabytes = f"{self.payload_bytes / 1e6:.1f} MB"
        if self.unit == "samples":
            what = f"{self.num_samples} samples ({megabytes})"
        else:
            what = f"{self.num_files} {self.unit} ({self.num_samples} samples, {megabytes})"
        line = (
            f"packed {what} into {self.num_shards} shards in {self.seconds:.1f} s: "
            f"{self.num_files / seconds:.0f} {self.unit}/s, {self.payload_bytes / 1e6 / seconds:.1f} MB/s"
        )
        if self.resumed:
            line += " (resumed)"
        if self.problems:
            skipped = sum(p.count for p in self.problems if not p.packed)
            warnings = sum(p.count for p in self.problems if p.packed)
            where = (
                f"see {self.dest}/{REPORT_NAME}"
                if self.dataset_totals is not None
                else "listed in the report once every part is done"
            )
            notes = problem_notes(self.problems)
            line += f"; {skipped} skipped, {warnings} warnings" + (f": {'; '.join(notes)}" if notes else "")
            line += f" ({where})"
        if self.dataset_totals is not None:
            t = self.dataset_totals
            line += f"; index {self.index_url}: {t['num_shards']} shards, {t['num_samples']} samples"
        else:
            line += "; other parts unfinished, index not written yet"
        return line


# The problems a summary line counts, as (kind, phrase for one, phrase for several): those
# users must not miss.
_NOTES = (
    (
        ProblemKind.MERGED,
        "key gathers files that differ only by an extra dot part",
        "keys gather files that differ only by an extra dot part",
    ),
    (
        ProblemKind.COLLISION,
        "file collides with another (same sample and member, e.g. names that differ only in case)",
        "files collide with others (same sample and member, e.g. names that differ only in case)",
    ),
    (ProblemKind.UNDECODABLE, "image does not decode", "images do not decode"),
    (ProblemKind.HIDDEN, "hidden file (.DS_Store ...) left out", "hidden files (.DS_Store ...) left out"),
)


def problem_notes(problems: Sequence[Problem]) -> list[str]:
    """Phrases for the summary line counting the problems users must not miss (:data:`_NOTES`):
    keys that gather files differing only by an extra dot part, files that collide, images that
    do not decode, hidden files left out."""
    counts = collections.Counter()
    for problem in problems:
        counts[problem.kind] += problem.count
    return [f"{counts[kind]} {one if counts[kind] == 1 else many}" for kind, one, many in _NOTES if counts[kind]]


def check_options(
    name: str, max_shard_bytes: int, max_samples_per_shard: int | None, *, jpeg_quality: int | None = None
) -> None:
    """Raise ValueError naming a bad shard name prefix, size limit (:class:`ShardLimits`) or
    JPEG quality (of the writers that encode images)."""
    if jpeg_quality is not None and not 1 <= jpeg_quality <= 95:
        raise ValueError(f"{jpeg_quality=} must be in 1..95")
    if not name or "/" in name:
        raise ValueError(f"shard name prefix {name!r} must be a non-empty name without '/'")
    ShardLimits(max_shard_bytes, max_samples_per_shard)


def open_destination(
    dest: str | os.PathLike[str],
    *,
    s3: S3Config | None,
    fetch: FetchConfig | None,
    requests: RequestConfig | None = None,
) -> Store:
    """The store at a writer's ``dest``: where every writer, its worker processes and its Ray
    tasks open it."""
    return open_store(dest, s3=s3, requests=requests, fetch=fetch)


def check_outside(store: Store, source_url: str) -> None:
    """Raise DestinationError when the destination lies inside the source (symlinks resolved)."""
    if isinstance(store, LocalStore):
        if is_remote_url(source_url):
            return
        dest, source = store.root.resolve(), Path(source_url).resolve()
        inside = dest == source or source in dest.parents
    else:
        inside = is_remote_url(source_url) and (store.url + "/").startswith(source_url + "/")
    if inside:
        raise DestinationError(
            f"{store.url} is inside SOURCE {source_url}, so pack would pack its own shards; pick a DEST outside SOURCE"
        )


def check_destination(store: Store) -> tuple[PackSpec | None, str | None]:
    """Check that ``store`` can be written; what it holds: the options of the pack recorded
    there (finished or not), or None, and the name of its index, or None.

    Raises:
        DestinationError: it cannot be written.
        IndexFormatError: the recorded options are damaged.
    """
    store.check_writable()
    old_spec = None
    if store.exists(SPEC_NAME):
        old_spec = PackSpec.from_json(store.read_bytes(SPEC_NAME), url=store.url_of(SPEC_NAME))
    index = next((name for name in (MANIFEST_NAME, INDEX_NAME) if store.exists(name)), None)
    return old_spec, index


def prepare_state(
    store: Store,
    spec: PackSpec,
    *,
    overwrite: bool,
    fix: str = "run the same command as before to finish it, pass --overwrite to replace it",
) -> bool:
    """Check that ``dest`` can be written and what it holds; wipe it for ``overwrite``; record
    ``spec``. ``fix`` is what the error for a ``dest`` in use tells the user to do (the CLI's
    words by default).

    Returns:
        True when ``dest`` already holds the finished result of this very pack.
    """
    old_spec, index = check_destination(store)
    if not overwrite:
        if old_spec == spec:
            return index is not None
        if index is not None or old_spec is not None:
            what = "a dataset" if index is not None else "an unfinished pack made with other options"
            differences = f" ({old_spec.differences(spec)})" if old_spec is not None else ""
            raise DestinationError(f"{store.url} already holds {what}{differences}; {fix}, or pick another DEST")
    else:
        wipe(store, old_spec)
    if not store.create_exclusive(SPEC_NAME, spec.to_json()):  # another part got there first
        winner = PackSpec.from_json(store.read_bytes(SPEC_NAME), url=store.url_of(SPEC_NAME))
        if winner != spec:
            raise DestinationError(
                f"{store.url}: another part started with other options ({winner.differences(spec)}); "
                "every part must use the same options"
            )
    return False


def index_totals(store: Store) -> dict[str, int]:
    """The totals of the index ``store`` holds."""
    return Manifest.parse(store.read_bytes(MANIFEST_NAME), url=store.url_of(MANIFEST_NAME)).totals()


def merge_when_done(store: Store, spec: PackSpec, *, empty: str) -> dict[str, int] | None:
    """Write the index once every stream (of every part) is done; its totals, or None while
    some are not.

    Raises:
        SourceError: ``empty``, when nothing at all was packed (the state is removed, so the
            next run starts afresh).
    """
    if unfinished_streams(store, spec):
        return None
    totals, _ = merge(store, spec)
    if totals["num_samples"] == 0:
        wipe(store, spec)
        store.remove_empty_dirs((STATE_DIR, ""))
        raise SourceError(empty)
    return totals


def wipe(store: Store, old_spec: PackSpec | None) -> None:
    """Delete a dataset (index first, so it never outlives its shards) and any pack state."""
    old_names: set[str] = set()
    for index_name in (MANIFEST_NAME, INDEX_NAME):
        if store.exists(index_name):
            try:
                old_names |= _shard_names(store, index_name)
            except IndexFormatError:
                pass
            store.delete(index_name)
    for name in store.list_names(f"{KEYS_DIR}/"):  # the key index, after the index that leads to it
        store.delete(name)
    old_names |= {n + TABLE_SUFFIX for n in old_names}
    for name in store.list_names(f"{STATE_DIR}/"):
        if name != SPEC_NAME:
            store.delete(name)
    if old_spec is not None:
        old_names.update(n for n in store.list_names(f"{old_spec.name}-") if old_spec.shard_of_name(n) is not None)
        store.remove_partials(
            lambda n: old_spec.shard_of_name(n) is not None or n.startswith(f"{STATE_DIR}/"), folders=("", STATE_DIR)
        )
    store.remove_partials(lambda n: n in (MANIFEST_NAME, INDEX_NAME, REPORT_NAME))
    for name in [*sorted(old_names), REPORT_NAME, SPEC_NAME]:
        store.delete(name)


def _shard_names(store: Store, index_name: str) -> set[str]:
    """The shard names an index (version 2 or 1) lists."""
    data, url = store.read_bytes(index_name), store.url_of(index_name)
    if index_name == MANIFEST_NAME:
        return set(Manifest.parse(data, url=url).names())
    return {s.name for s in Index.from_json(data, url=url).shards}
