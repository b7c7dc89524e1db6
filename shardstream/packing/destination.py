"""The destination every writer shares: ``pack``, :class:`shardstream.ShardWriter`,
:func:`shardstream.pack_samples` and the Ray datasink (:mod:`shardstream.packing.ray_sink`)
check their options here (:func:`check_options`), open ``dest`` (:func:`open_destination`),
check what it holds and claim it (:func:`prepare_state`, or :func:`check_destination` and
:func:`wipe` for the datasink, which keeps no pack state), write the index once every part is
done (:func:`merge_when_done`), and say what they did (:class:`PackReport`). Each shard is
published by :class:`shardstream.packing.writer.RotatingTarWriter`, for all of them."""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import FetchConfig, RequestConfig, S3Config
from ..errors import DestinationError, SourceError
from ..index import INDEX_NAME, KEYS_DIR, MANIFEST_NAME, Manifest
from ..index.status import MERGED_NAME, unfinished_pack
from ..storage import LocalStore, Store, is_remote_url, open_store
from .journal import REPORT_NAME, SPEC_NAME, STATE_DIR, PackSpec
from .merge import merge, merged_here, merged_manifest, record_merged, unfinished_streams
from .ownership import NAMES_SHOWN, foreign_names, pack_writes, recorded_names, refuse_foreign, top_level_names
from .sources import Problem, ProblemKind
from .writer import ShardLimits

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "Claim",
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
log = logging.getLogger("shardstream")


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
        kept: with ``overwrite``, the files and folders at ``dest`` that the earlier dataset
            did not record, left in place (:class:`Claim`).
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
    kept: tuple[str, ...] = ()

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
                f"{counted(t['num_shards'], 'shard')}, {counted(t['num_samples'], 'sample')}"
            )
        seconds = max(self.seconds, 1e-9)
        megabytes = f"{self.payload_bytes / 1e6:.1f} MB"
        unit = self.unit.removesuffix("s")
        if self.unit == "samples":
            what = f"{counted(self.num_samples, 'sample')} ({megabytes})"
        else:
            what = f"{counted(self.num_files, unit)} ({counted(self.num_samples, 'sample')}, {megabytes})"
        line = (
            f"packed {what} into {counted(self.num_shards, 'shard')} in {self.seconds:.1f} s: "
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
            line += f"; {skipped} skipped, {counted(warnings, 'warning')}" + (f": {'; '.join(notes)}" if notes else "")
            line += f" ({where})"
        if self.dataset_totals is not None:
            t = self.dataset_totals
            line += (
                f"; index {self.index_url}: {counted(t['num_shards'], 'shard')}, {counted(t['num_samples'], 'sample')}"
            )
        else:
            line += "; other parts unfinished, index not written yet"
        if self.kept:
            shown = ", ".join(self.kept[:NAMES_SHOWN]) + (
                f" and {len(self.kept) - NAMES_SHOWN} more" if len(self.kept) > NAMES_SHOWN else ""
            )
            line += f"; kept what the earlier dataset did not record: {shown}"
        return line


def counted(count: int, word: str) -> str:
    """``"1 shard"``, ``"2 shards"``: a count and its noun, plural where it is not 1."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


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
    (ProblemKind.NOT_A_SAMPLE, "metadata file left out", "metadata files left out"),
    (ProblemKind.NO_SUFFIX, "file without a suffix", "files without a suffix"),
    (ProblemKind.UNKNOWN_CLASS, "label not among the classes given", "labels not among the classes given"),
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


@dataclass(frozen=True)
class Claim:
    """What :func:`prepare_state` found at a destination and did there.

    Attributes:
        complete: ``dest`` already holds the finished result of this very pack, its index the
            pack's own: nothing to do.
        kept: with ``overwrite``, the files and folders left at ``dest`` after the earlier
            dataset and pack state were deleted (:func:`~.ownership.top_level_names`).
    """

    complete: bool
    kept: tuple[str, ...] = ()


def prepare_state(
    store: Store,
    spec: PackSpec,
    *,
    overwrite: bool,
    clobber: bool = False,
    fix: str = "run the same command as before to finish it, pass --overwrite to replace it",
    clobber_option: str = "--clobber",
    what: str = "this pack",
) -> Claim:
    """Check that ``dest`` can be written and what it holds; refuse names the pack would write
    that are not recorded as shardstream's (:mod:`.ownership`) unless ``clobber``; with
    ``overwrite``, delete the earlier dataset and pack state (only what they record); record
    ``spec``. ``fix`` and ``clobber_option`` are what the errors tell the user to do (the CLI's
    words by default), ``what`` names the writer in them.

    Raises:
        DestinationError: ``dest`` cannot be written, holds a dataset or another pack's state
            (and not ``overwrite``), or files with the pack's names it did not write (and not
            ``clobber``).
        IndexFormatError: the state or index there is damaged.
    """
    old_spec, index = check_destination(store)
    recorded: set[str] = set()
    if not overwrite:
        if old_spec == spec:  # resumed: the first run claimed dest
            return Claim(complete=index is not None and _own_index(store, spec, index))
        if index is not None or old_spec is not None:
            what_is_there = "a dataset" if index is not None else "an unfinished pack made with other options"
            differences = f" ({old_spec.differences(spec)})" if old_spec is not None else ""
            raise DestinationError(
                f"{store.url} already holds {what_is_there}{differences}; {fix}, or pick another DEST"
            )
    else:
        recorded = recorded_names(store)
    if not clobber:
        foreign = foreign_names(store, pack_writes(spec.name), recorded, name=spec.name)
        if foreign and not overwrite and store.exists(SPEC_NAME):  # another part claimed dest meanwhile?
            claimed = PackSpec.from_json(store.read_bytes(SPEC_NAME), url=store.url_of(SPEC_NAME))
            if claimed == spec:
                return Claim(complete=False)
        refuse_foreign(store, foreign, option=clobber_option, what=what)
    kept: tuple[str, ...] = ()
    if overwrite:
        wipe(store, old_spec, recorded=recorded)
        kept = tuple(top_level_names(store))
    if not store.create_exclusive(SPEC_NAME, spec.to_json()):  # another part got there first
        winner = PackSpec.from_json(store.read_bytes(SPEC_NAME), url=store.url_of(SPEC_NAME))
        if winner != spec:
            raise DestinationError(
                f"{store.url}: another part started with other options ({winner.differences(spec)}); "
                "every part must use the same options"
            )
    return Claim(complete=False, kept=kept)


def merge_pack(store: Store, *, overwrite: bool = False) -> tuple[dict[str, int], list[Problem]]:
    """``shardstream index merge``: write the index of the pack recorded at ``store`` once
    every part is done (:func:`~.merge.merge`); its totals and problems.

    Raises:
        DestinationError: no pack state is there; some parts have not finished; or an
            ``index.bin`` is there that is not the one the pack wrote (an ``index build`` over
            its shards), and not ``overwrite``.
        IndexFormatError: the state is damaged.
    """
    if not store.exists(SPEC_NAME):
        raise DestinationError(
            f"{store.url} holds no pack state ({store.url_of(SPEC_NAME)}), so there is nothing to merge; "
            "index shards other tools wrote with shardstream index build"
        )
    spec = PackSpec.from_json(store.read_bytes(SPEC_NAME), url=store.url_of(SPEC_NAME))
    if not overwrite and store.exists(MANIFEST_NAME):
        manifest = Manifest.parse(store.read_bytes(MANIFEST_NAME), url=store.url_of(MANIFEST_NAME))
        own = merged_here(store, spec, manifest)
        if not own and unfinished_streams(store, spec):
            merge(store, spec)  # raises, naming the parts that have not finished
        if not own and merged_manifest(store, spec)[0].content_digest() != manifest.content_digest():
            raise DestinationError(
                f"{store.url_of(MANIFEST_NAME)} is not the index the pack recorded there wrote ({manifest.num_shards} "
                f"shards, {manifest.num_samples} samples{'; ' + manifest.partial if manifest.partial else ''}); "
                "pass --overwrite to replace it with the pack's own"
            )
    return merge(store, spec)


def _own_index(store: Store, spec: PackSpec, index: str) -> bool:
    """Whether the index at ``store`` is the one the finished pack ``spec`` wrote there: its
    merge record says so, or (a pack finished by a shardstream that wrote none) the index its
    records make is the same. False, with a warning naming the difference, for an index built
    over its shards by another command (``index build`` over an unfinished pack): the pack then
    goes on and writes its own."""
    if index != MANIFEST_NAME:  # a version 1 dataset: its pack finished before any of this
        return True
    manifest = Manifest.parse(store.read_bytes(MANIFEST_NAME), url=store.url_of(MANIFEST_NAME))
    if merged_here(store, spec, manifest):
        return True
    found = f"{store.url_of(MANIFEST_NAME)} ({manifest.num_shards} shards, {manifest.num_samples} samples)"
    status = unfinished_pack(store, manifest)
    if status is not None and not status.complete:
        log.warning(
            "%s indexes an unfinished pack (%s), not this pack's result: the pack goes on, then writes its own index",
            found,
            status.progress(),
        )
        return False
    built, _ = merged_manifest(store, spec)
    if built.content_digest() == manifest.content_digest():
        record_merged(store, spec, built)
        return True
    log.warning(
        "%s is not the index this pack's records make (%d shards, %d samples): it is written again from them",
        found,
        built.num_shards,
        built.num_samples,
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


def wipe(store: Store, old_spec: PackSpec | None, *, recorded: set[str] | None = None) -> None:
    """Delete a dataset and any pack state: only the names they record (``recorded``, default
    :func:`~.ownership.recorded_names`), the index first, so it never outlives its shards, and
    the options (``pack.json``) last; files a killed writer of them left half-written too.
    Anything else at ``store`` stays."""
    recorded = recorded_names(store) if recorded is None else recorded
    first = [n for n in (MERGED_NAME, MANIFEST_NAME, INDEX_NAME) if n in recorded]
    keys = sorted(n for n in recorded if n.startswith(f"{KEYS_DIR}/"))
    state = sorted(n for n in recorded if n.startswith(f"{STATE_DIR}/") and n not in (MERGED_NAME, SPEC_NAME))
    shards = sorted(recorded - {*first, *keys, *state, REPORT_NAME, SPEC_NAME})
    for name in [*first, *keys, *shards, *([REPORT_NAME] if REPORT_NAME in recorded else []), *state]:
        store.delete(name)
    if old_spec is not None:
        store.remove_partials(
            lambda n: old_spec.shard_of_name(n) is not None or n.startswith(f"{STATE_DIR}/"), folders=("", STATE_DIR)
        )
    store.remove_partials(lambda n: n in (MANIFEST_NAME, INDEX_NAME, REPORT_NAME))
    if SPEC_NAME in recorded:
        store.delete(SPEC_NAME)
    store.remove_empty_dirs((KEYS_DIR, STATE_DIR))
