"""A labels file: ``pack --labels-from FILE``, labels kept beside the files instead of in class
folders (an ImageNet-style validation set: one flat folder plus a ``filename,label`` CSV).

The file is CSV (with a header row) or JSON Lines (``.jsonl``, one object a line), UTF-8. Each
row names a file, relative to SOURCE (``a.JPEG``, ``val/a.JPEG``; ``/`` separates folders),
and its label, a class name (or a number, taken as its text). The columns are found by name,
the first present of:

- the file: ``file_name`` (Hugging Face ``imagefolder``'s ``metadata.csv``), ``filename``,
  ``file``, ``path``, ``image``;
- the label: ``label`` (Hugging Face's), ``class``, ``class_name``, ``cls``, ``labels``.

The classes are the distinct labels, sorted (numerically when every label is an integer: ``2``
before ``10``), unless pinned (``--classes``, ``--classes-from``). Reported, naming the file and
line (``ProblemKind.METADATA``, under ``on_error``): a row without a file or label, a file
outside SOURCE, a file named twice, and (after the walk) a row naming a file that is not there.
Memory: the rows, about 100 bytes each.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import re
from dataclasses import dataclass, field

from ..errors import SourceError
from .sources import OnProblem, Problem, ProblemKind

__all__ = ["FILE_COLUMNS", "LABEL_COLUMNS", "LabelFile", "parse_label_file", "sorted_labels"]

FILE_COLUMNS = ("file_name", "filename", "file", "path", "image")
LABEL_COLUMNS = ("label", "class", "class_name", "cls", "labels")
_INT = re.compile(r"[+-]?\d+")


@dataclass
class LabelFile:
    """The rows of a labels file: file (normalised, relative to SOURCE) -> (line, label)."""

    path: str
    rows: dict[str, tuple[int, str]] = field(default_factory=dict)

    def take(self, rel: str) -> str | None:
        """The label of the file at ``rel`` (relative to SOURCE), or None; taken out, so that
        :meth:`unused` lists the rows no file took."""
        row = self.rows.pop(rel, None)
        return None if row is None else row[1]

    def unused(self, on_problem: OnProblem) -> None:
        """Report each row no file of the walk took."""
        for name, (line, _) in sorted(self.rows.items(), key=lambda item: item[1][0]):
            on_problem(
                Problem(
                    self.path,
                    ProblemKind.METADATA,
                    f"line {line}: names {name!r}, not a file under SOURCE (check the name, or remove the row)",
                )
            )
        self.rows.clear()


def sorted_labels(labels: list[str]) -> list[str]:
    """The class list of ``labels``: distinct, sorted as numbers when every one is an integer,
    else as text (``sorted()``, torchvision's order for folder names)."""
    distinct = set(labels)
    if distinct and all(_INT.fullmatch(label) for label in distinct):
        return sorted(distinct, key=lambda label: (int(label), label))  # "7" before "07": one order
    return sorted(distinct)


def parse_label_file(path: str, data: bytes, on_problem: OnProblem) -> LabelFile:
    """The rows of the labels file at ``path`` whose bytes are ``data`` (module doc).

    Raises:
        SourceError: it is not UTF-8, not CSV or JSON Lines, or has no file or label column
            (names the columns it has and those looked for).
    """
    labels = LabelFile(path)

    def problem(line: int, reason: str) -> None:
        on_problem(Problem(path, ProblemKind.METADATA, f"line {line}: {reason}"))

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: the labels file is not UTF-8 text ({exc}); save it as UTF-8") from None
    if path.endswith(".jsonl"):
        rows = _jsonl_rows(path, text)
    else:
        rows = _csv_rows(path, text)
    if not rows:
        raise SourceError(
            f"{path}: the labels file has no rows; give a file with a {FILE_COLUMNS[0]} and a label column"
        )
    columns = {name for _, row in rows for name in row}
    file_column = _pick(FILE_COLUMNS, columns, path, "file")
    label_column = _pick(LABEL_COLUMNS, columns, path, "label")
    for line, row in rows:
        name, label = row.get(file_column), row.get(label_column)
        if not isinstance(name, str) or not name:
            problem(line, f"no {file_column} (a path relative to SOURCE); add one")
            continue
        if label is None or label == "" or isinstance(label, (dict, list, bool)):
            problem(line, f"no {label_column} for {name!r} (a class name or number); add one")
            continue
        norm = posixpath.normpath(name.replace("\\", "/"))
        if norm.startswith(("/", "../")) or norm in ("..", "."):
            problem(line, f"{file_column} {name!r} is not a file under SOURCE")
            continue
        if norm in labels.rows:
            problem(line, f"{file_column} {name!r} repeats the row of line {labels.rows[norm][0]}; keep one")
            continue
        labels.rows[norm] = (line, str(label).strip())
    return labels


def _pick(names: tuple[str, ...], columns: set[str], path: str, what: str) -> str:
    for name in names:
        if name in columns:
            return name
    raise SourceError(
        f"{path}: no {what} column: looked for {', '.join(names)}; the file has "
        f"{', '.join(sorted(columns)) or 'none'} (rename the column)"
    )


def _jsonl_rows(path: str, text: str) -> list[tuple[int, dict]]:
    rows = []
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise SourceError(f"{path}: line {line} is not JSON ({exc}); fix it") from None
        if not isinstance(doc, dict):
            raise SourceError(f"{path}: line {line} is not a JSON object; write one object per line")
        rows.append((line, doc))
    return rows


def _csv_rows(path: str, text: str) -> list[tuple[int, dict]]:
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = [(reader.line_num, {k: v for k, v in row.items() if k is not None}) for row in reader]
    except csv.Error as exc:
        raise SourceError(
            f"{path}: not CSV ({exc}); give a CSV file with a header row, or JSON Lines (.jsonl)"
        ) from None
    return rows
