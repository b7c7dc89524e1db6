"""Per-file metadata beside a tree of class folders (``pack --labels-from-dirs``), in Hugging
Face ``imagefolder``'s convention: a ``metadata.jsonl`` or ``metadata.csv`` in a folder, whose
``file_name`` column names a file relative to that folder, adds the row's other columns to that
file's sample as a ``json`` member (a JSON object, the columns in the file's order).

Scope: a metadata file covers the files of its own folder and of every folder below it
(``file_name`` may hold ``/``: ``zebra/a.JPEG`` in ``SOURCE/metadata.jsonl``). A file covered by
several takes its row from the nearest one that has a row for it. Reported, each naming the
metadata file and its line (``ProblemKind.METADATA``, under ``on_error`` like any problem):

- a metadata file that cannot be read or parsed, or a folder holding both names;
- a row without a ``file_name``, with one that leaves the folder, or repeating an earlier row's;
- a row naming a file that does not exist (found once its folder's walk is over);
- a row that a nearer metadata file's row for the same file overrides.

A covered file without a row is packed without ``json`` and reported (``NO_METADATA``, a
warning). The metadata files themselves are not packed.

JSONL rows keep their JSON values. CSV cells are typed per column as pandas would read them:
a column whose cells are all integers becomes integers, all numbers floats, all ``true`` /
``false`` booleans; anything else stays text; an empty cell is ``null``.

Memory: the rows of the metadata files covering the folder being walked (each row as its JSON
bytes), dropped when the walk leaves the metadata file's folder.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .sources import METADATA_NAMES, OnProblem, Problem, ProblemKind, SourceFile

__all__ = ["METADATA_NAMES", "MetadataScopes", "parse_metadata"]

_INT = re.compile(r"[+-]?\d+")
_BOOLS = {"true": True, "false": False}


@dataclass
class _Scope:
    """One metadata file's rows: ``file_name`` (relative to ``folder``) -> (line, JSON bytes)."""

    folder: str  # "" or "a/b/"
    path: str
    rows: dict[str, tuple[int, bytes]] = field(default_factory=dict)


class MetadataScopes:
    """The metadata files covering the folder being walked, nearest last.

    Call :meth:`enter` with each folder in walk order (depth first, a folder before its
    subfolders), :meth:`take` for each file of it, and :meth:`close` after the walk.
    """

    def __init__(self, on_problem: OnProblem, read: Callable[[SourceFile], bytes]) -> None:
        self._on_problem = on_problem
        self._read = read
        self._stack: list[_Scope] = []

    @property
    def active(self) -> bool:
        """Whether some metadata file covers the folder being walked."""
        return bool(self._stack)

    def enter(self, folder: str, files: list[SourceFile]) -> None:
        """Walk into ``folder`` (``""`` or ``"a/b/"``), whose files are ``files``: close the
        scopes it lies outside of, open its own metadata file's."""
        while self._stack and not folder.startswith(self._stack[-1].folder):
            self._finish(self._stack.pop())
        found = [f for f in files if f.member_name[len(folder) :] in METADATA_NAMES]
        if len(found) > 1:
            jsonl, csv_file = sorted(found, key=lambda f: not f.member_name.endswith(".jsonl"))
            self._on_problem(
                Problem(
                    csv_file.path,
                    ProblemKind.METADATA,
                    f"{folder or './'} holds both metadata.jsonl and metadata.csv; only metadata.jsonl is used: "
                    "merge them into one",
                )
            )
            found = [jsonl]
        if found:
            scope = _Scope(folder, found[0].path)
            try:
                data = self._read(found[0])
            except OSError as exc:
                self._problem(scope.path, f"cannot read: {getattr(exc, 'strerror', None) or exc}")
                data = None
            if data is not None:
                scope.rows = parse_metadata(found[0].member_name, scope.path, data, self._on_problem)
            self._stack.append(scope)

    def take(self, rel: str, path: str) -> bytes | None:
        """The JSON bytes of the row for the file ``rel`` (relative to SOURCE) at ``path``, or
        None; its rows are taken out of every scope (so none is reported as naming no file)."""
        found: bytes | None = None
        nearer = ""
        for scope in reversed(self._stack):
            row = scope.rows.pop(rel[len(scope.folder) :], None)
            if row is None:
                continue
            if found is None:
                found, nearer = row[1], scope.path
            else:
                self._problem(
                    scope.path,
                    f"line {row[0]}: the row for {rel[len(scope.folder) :]!r} is not used, {nearer} has one for "
                    "the same file (the nearest metadata file wins); remove one of them",
                )
        return found

    def close(self) -> None:
        """The walk is over: report the rows no file took."""
        while self._stack:
            self._finish(self._stack.pop())

    def _finish(self, scope: _Scope) -> None:
        for name, (line, _) in scope.rows.items():
            self._problem(
                scope.path,
                f"line {line}: file_name {name!r} names no file under {scope.folder or './'} (check the name, "
                "or remove the row)",
            )
        scope.rows.clear()

    def _problem(self, path: str, reason: str) -> None:
        self._on_problem(Problem(path, ProblemKind.METADATA, reason))


def parse_metadata(name: str, path: str, data: bytes, on_problem: OnProblem) -> dict[str, tuple[int, bytes]]:
    """The rows of the metadata file ``name`` (``metadata.jsonl`` or ``metadata.csv``, at
    ``path``): normalised ``file_name`` -> (line number, the other columns as JSON bytes). Rows
    that cannot be used are reported (``METADATA``) and left out."""
    rows: dict[str, tuple[int, bytes]] = {}

    def problem(reason: str) -> None:
        on_problem(Problem(path, ProblemKind.METADATA, reason))

    def add(line: int, file_name: Any, columns: dict[str, Any]) -> None:
        if not isinstance(file_name, str) or not file_name:
            problem(f"line {line}: no file_name (a path relative to the metadata file's folder); add one")
            return
        norm = posixpath.normpath(file_name.replace("\\", "/"))
        if norm.startswith(("/", "../")) or norm in ("..", "."):
            problem(f"line {line}: file_name {file_name!r} is not a file in the metadata file's folder or below")
            return
        if norm in rows:
            problem(f"line {line}: file_name {file_name!r} repeats the row of line {rows[norm][0]}; keep one")
            return
        rows[norm] = (line, json.dumps(columns).encode())  # ASCII, no line break: fits a listing line

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        problem(f"is not UTF-8 text ({exc}); save it as UTF-8")
        return rows
    if name.endswith(".jsonl"):
        for line, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                doc = json.loads(raw)
            except ValueError as exc:
                problem(f"line {line}: not JSON ({exc})")
                continue
            if not isinstance(doc, dict):
                problem(f"line {line}: not a JSON object; write one object per line")
                continue
            file_name = doc.pop("file_name", None)
            add(line, file_name, doc)
        return rows
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        read = [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        problem(f"not CSV ({exc})")
        return rows
    if "file_name" not in header:
        problem(f"has no file_name column (its columns: {', '.join(map(repr, header)) or 'none'}); add one")
        return rows
    columns = [c for c in header if c != "file_name"]
    typed = {c: _column_type([row.get(c) for _, row in read]) for c in columns}
    for line, row in read:
        if None in row:
            problem(f"line {line}: more cells than the header has columns")
            continue
        add(line, row["file_name"], {c: typed[c](row.get(c)) for c in columns})
    return rows


def _column_type(cells: list[str | None]) -> Callable[[str | None], Any]:
    """How a CSV column's cells become JSON values (module doc)."""
    values = [c for c in cells if c not in (None, "")]

    def typed(convert: Callable[[str], Any]) -> Callable[[str | None], Any]:
        return lambda cell: None if cell in (None, "") else convert(cell)  # type: ignore[arg-type]

    if values and all(_INT.fullmatch(v.strip()) for v in values):  # type: ignore[union-attr]
        return typed(lambda v: int(v.strip()))
    if values and all(_is_float(v) for v in values):  # type: ignore[arg-type]
        return typed(float)
    if values and all(v.strip().lower() in _BOOLS for v in values):  # type: ignore[union-attr]
        return typed(lambda v: _BOOLS[v.strip().lower()])
    return typed(str)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
