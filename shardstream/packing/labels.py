"""Class folders become labels: ``pack(SOURCE, DEST, labels_from_dirs=True)``.

SOURCE is a tree of class folders, as torchvision's ``ImageFolder`` reads it::

    SOURCE/zebra/a.b.JPEG  ->  sample key 'zebra/a%2Eb', members 'zebra/a%2Eb.cls' (b"12"),
                               'zebra/a%2Eb.jpeg' (the file), 'zebra/a%2Eb.json' (its metadata row)

- The classes are the names of the folders directly under SOURCE, sorted (``sorted()`` of the
  names, torchvision's order); a sample's class index is its class's position there, written in
  the ``cls`` member as ASCII digits (what WebDataset's ``.cls`` holds). Folders deeper down
  belong to their top-level class. The index records the class names and the samples of each
  (:attr:`~shardstream.index.Manifest.classes`, ``class_counts``).
- Each file is a sample of its own. Its key is its path relative to SOURCE without the last
  suffix, ``%`` written ``%25`` and the file name's dots ``%2E``: readers split a member
  name into key and extension at the first dot of the file name (WebDataset's rule, and
  shardstream's own when it reads a whole shard), so a key's file name holds no dot;
  ``urllib.parse.unquote(key)`` gives the path back. Its member is named by the last suffix,
  lower-cased (``JPEG`` -> ``jpeg``).
- A ``metadata.jsonl`` / ``metadata.csv`` adds a ``json`` member (:mod:`.metadata`).

Reported, each under ``on_error`` (the pack stops naming the first, or leaves it out and lists it):

- a file directly under SOURCE (``UNLABELLED``: it is in no class folder);
- a hidden file (``.DS_Store``, macOS's ``._x``): ``HIDDEN``, listed but never a reason to stop;
- a file with no suffix (``README``), or whose suffix is ``cls`` (pack writes that
  member), or ``json`` where a metadata row would add one (``BAD_NAME``);
- two files of one folder that would have one key (``a.JPEG`` and ``a.jpg``): ``COLLISION``,
  reported for both, neither packed (they are never merged);
- a class folder whose name is not UTF-8 or holds a line break (``BAD_NAME``; left out under
  ``skip``, with its files: the class indices of the others then differ from torchvision's).

The walk is :mod:`.sources`' walk of a local directory or a store prefix; memory is the
entries of one folder, the class names and counts, and the metadata rows in scope.
``--files-from`` is refused (the classes are the folders of a walk).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import IndexFormatError
from ..format import RESERVED_FIELDS
from ..storage import Store, is_remote_url, open_store
from .label_file import LabelFile, sorted_labels
from .metadata import METADATA_NAMES, MetadataScopes
from .sources import ListDir, OnProblem, Problem, ProblemKind, Sample, SourceFile, lister_of, name_problem, ordered_walk

__all__ = ["CLASSES_NAME", "ClassCounts", "label_key", "read_classes", "walk_labelled", "write_classes"]

CLASSES_NAME = ".shardstream/classes.json"  # the pack's class names and counts, read by the merge
LABEL_EXT = "cls"
METADATA_EXT = "json"


@dataclass
class ClassCounts:
    """The classes of a labelled pack: names in class-index order, and the samples of each
    listed so far."""

    names: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)


def label_key(rel_stem: str) -> str:
    """The sample key of a file at ``rel_stem`` (its path relative to SOURCE without the last
    suffix): ``%`` percent-encoded, and the file name's dots (module doc)."""
    folder, _, stem = rel_stem.replace("%", "%25").rpartition("/")
    escaped = stem.replace(".", "%2E")
    return f"{folder}/{escaped}" if folder else escaped


def _split_suffix(name: str) -> tuple[str, str]:
    """``("a.b", "JPEG")`` for ``"a.b.JPEG"``; ``(name, "")`` when the name has no suffix (no dot
    but a leading one, or a trailing dot), as :class:`pathlib.PurePath` splits it."""
    dot = name.rfind(".")
    if dot <= 0 or dot == len(name) - 1:
        return name, ""
    return name[:dot], name[dot + 1 :]


def walk_labelled(
    source: str,
    *,
    on_problem: OnProblem,
    classes: ClassCounts,
    s3=None,
    requests=None,
    threads: int | None = None,
    labels: LabelFile | None = None,
    pinned: Sequence[str] | None = None,
) -> Iterator[Sample]:
    """The labelled samples of ``source`` (an absolute local directory or a store URL) in walk
    order; ``classes`` is filled as the walk goes (names once known, counts as samples are
    yielded).

    Args:
        labels: take each file's label from this labels file (:mod:`.label_file`) instead of
            its class folder; files may then lie anywhere under ``source``.
        pinned: the class list to use (another dataset's, ``--classes-from``), instead of the
            folders' names or the labels' values; a label not in it is a problem
            (``UNKNOWN_CLASS``).

    Raises:
        what ``on_problem`` raises (``on_error="raise"``).
    """
    lister, threads = lister_of(source, s3=s3, requests=requests, threads=threads)
    store = open_store(source, s3=s3, requests=requests) if is_remote_url(source) else None

    def read(file: SourceFile) -> bytes:
        if store is not None:
            return store.read_bytes(file.member_name)
        with open(file.path, "rb") as f:
            return f.read()

    scopes = MetadataScopes(on_problem, read)
    index: dict[str, int] = {}
    if pinned is not None or labels is not None:
        names = list(pinned) if pinned is not None else sorted_labels([label for _, label in labels.rows.values()])
        classes.names, classes.counts = names, [0] * len(names)
        index = {name: i for i, name in enumerate(names)}
    given = "given (--classes or --classes-from)" if pinned is not None else ""

    def class_of(rel: str, file: SourceFile) -> tuple[int | None, Problem | None]:
        """The class index of a file, or the problem that leaves it out."""
        if labels is not None:
            label = labels.take(file.member_name)
            if label is None:
                reason = f"has no row in the labels file {labels.path}; add one, or move the file out of SOURCE"
                return None, Problem(file.path, ProblemKind.UNLABELLED, reason)
            what = f"its label {label!r} (in {labels.path})"
        elif not rel:
            return None, Problem(
                file.path,
                ProblemKind.UNLABELLED,
                "a file directly under SOURCE is in no class folder (--labels-from-dirs takes the folders "
                "directly under SOURCE as the classes); move it into one",
            )
        else:
            label = rel.split("/", 1)[0]
            what = f"its class folder {label!r}"
        cls = index.get(label)
        if cls is None and given:
            reason = f"{what} is not among the {len(index)} classes {given}"
            return None, Problem(file.path, ProblemKind.UNKNOWN_CLASS, reason)
        return cls, None

    skip = {labels.path} if labels is not None else set()
    for rel, files, subdirs, problems in ordered_walk(_class_folders_checked(lister, source), threads=threads):
        for problem in problems:
            on_problem(problem)
        if rel == "" and not index:
            classes.names = sorted(d.rstrip("/") for d in subdirs)
            classes.counts = [0] * len(classes.names)
            index = {name: i for i, name in enumerate(classes.names)}
        scopes.enter(rel, files)
        files = [f for f in files if f.path not in skip]
        option = "--labels-from" if labels is not None else "--labels-from-dirs"
        yield from _label_folder(rel, files, class_of, classes, scopes, on_problem, option)
    scopes.close()
    if labels is not None:
        labels.unused(on_problem)


def _class_folders_checked(list_dir: ListDir, source: str) -> ListDir:
    """``list_dir`` where a class folder whose name cannot be a class (not UTF-8, a line
    break) is reported and left out of the walk."""

    def listed(rel: str) -> tuple[list[SourceFile], list[str], list[Problem]]:
        files, subdirs, problems = list_dir(rel)
        if rel:
            return files, subdirs, problems
        kept = []
        for sub in subdirs:
            name = sub.rstrip("/")
            path = f"{source}/{name}" if is_remote_url(source) else os.path.join(source, name)
            if "\n" in name or "\r" in name:
                reason = "the class folder's name holds a line break"
            elif not _is_utf8(name):
                reason = "the class folder's name is not valid UTF-8"
            else:
                kept.append(sub)
                continue
            problems.append(Problem(path, ProblemKind.BAD_NAME, f"{reason}; rename it (its files are not packed)"))
        return files, kept, problems

    return listed


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _label_folder(
    rel: str,
    files: list[SourceFile],
    class_of: Callable[[str, SourceFile], tuple[int | None, Problem | None]],
    classes: ClassCounts,
    scopes: MetadataScopes,
    on_problem: OnProblem,
    option: str = "--labels-from-dirs",
) -> list[Sample]:
    """The samples of one folder's files (module doc), sorted by key; ``option`` is how
    messages name the way the pack labels files."""
    by_key: dict[str, list[tuple[SourceFile, str, bytes | None, int]]] = {}
    for file in files:
        name = file.member_name[len(rel) :]
        if name in METADATA_NAMES:
            continue
        if name.startswith("."):
            on_problem(Problem(file.path, ProblemKind.HIDDEN, "a hidden file (such as .DS_Store): not packed"))
            continue
        row = scopes.take(file.member_name, file.path)
        cls, problem = class_of(rel, file)
        if problem is not None:
            on_problem(problem)
            continue
        problem = name_problem(file.member_name, file.path)
        stem, suffix = _split_suffix(name)
        ext = suffix.lower()
        if problem is None and not suffix:
            problem = Problem(
                file.path, ProblemKind.BAD_NAME, "has no suffix (such as .jpg) to name its member; rename it"
            )
        elif problem is None and (ext == LABEL_EXT or ext in RESERVED_FIELDS or (ext == METADATA_EXT and row)):
            made = "the class index" if ext == LABEL_EXT else "its metadata row" if ext == METADATA_EXT else "a field"
            problem = Problem(
                file.path,
                ProblemKind.BAD_NAME,
                f"suffix {suffix!r} names the member pack writes for {made} ({option}); rename the file",
            )
        if problem is not None:
            on_problem(problem)
            continue
        if cls is None:  # a class folder left out of the walk's root listing cannot be walked into
            continue
        by_key.setdefault(label_key(rel + stem), []).append((file, ext, row, cls))
    samples = []
    for key in sorted(by_key):
        entries = by_key[key]
        if len(entries) > 1:
            for file, _, _, _ in entries:
                others = " and ".join(repr(other.path) for other, _, _, _ in entries if other is not file)
                on_problem(
                    Problem(
                        file.path,
                        ProblemKind.COLLISION,
                        f"same sample key {key!r} as {others} ({option} keys a file by its path "
                        "without the last suffix); neither is packed: rename one",
                    )
                )
            continue
        file, ext, row, cls = entries[0]
        member = f"{key}.{ext}"
        members = [
            SourceFile(member, file.path, file.size, rel=None if member == file.member_name else file.member_name),
            _made(f"{key}.{LABEL_EXT}", str(cls).encode()),
        ]
        if row is not None:
            members.append(_made(f"{key}.{METADATA_EXT}", row))
        elif scopes.active:
            on_problem(
                Problem(
                    file.path,
                    ProblemKind.NO_METADATA,
                    "the metadata file covering its folder has no row for it: packed without a json member",
                )
            )
        classes.counts[cls] += 1
        samples.append(Sample(key, tuple(sorted(members, key=lambda m: m.member_name))))
    return samples


def _made(member_name: str, data: bytes) -> SourceFile:
    return SourceFile(member_name, "", len(data), data=data)


# -- the class list a pack records, for its index ----------------------------------------------


def write_classes(store: Store, names: list[str], counts: list[int] | None) -> None:
    """Record a pack's classes (``DEST/.shardstream/classes.json``) for the merge."""
    store.write_bytes(CLASSES_NAME, json.dumps({"classes": names, "class_counts": counts}).encode())


def read_classes(store: Store) -> tuple[list[str], list[int] | None] | None:
    """The classes a pack recorded, or None (not a labelled pack).

    Raises:
        IndexFormatError: the record is damaged.
    """
    try:
        data = store.read_bytes(CLASSES_NAME)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
        names = [str(n) for n in doc["classes"]]
        counts = None if doc["class_counts"] is None else [int(c) for c in doc["class_counts"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise IndexFormatError(
            f"{store.url_of(CLASSES_NAME)}: damaged class record ({exc!r}); pack again with --overwrite"
        ) from exc
    return names, counts


def input_classes(source: str, *, s3=None, requests=None) -> tuple[list[str], list[int] | None] | None:
    """The classes of the dataset a reshard (``--from-shards``) reads, when ``source`` is a
    dataset's directory or prefix whose index records them; else None."""
    from ..errors import ShardNotFoundError
    from ..format import SHARD_SUFFIXES
    from ..index import open_index

    if "{" in source or source.endswith(SHARD_SUFFIXES):
        return None
    try:
        manifest = open_index(source if is_remote_url(source) else os.path.abspath(source), s3=s3, requests=requests)
    except ShardNotFoundError:
        return None
    classes = manifest.manifest.classes
    return None if classes is None else (classes, manifest.manifest.class_counts)
