"""Fields: which members of a sample to hand out, and under which names.

A field spec names each output and the member extensions it may come from, alternatives
separated by ``;`` and matched case-insensitively against the last dot part of the member's
extension (``"jpg;jpeg"`` matches members ``jpg``, ``JPEG`` and ``left.jpeg``), the first
alternative present winning (webdataset's ``.rename(image="jpg;png")`` / ``.to_tuple``)::

    {"image": "jpg;jpeg;png;webp", "label": "cls"}   # samples become dicts with these keys
    ("jpg;jpeg;png", "cls")                           # samples become tuples in this order

:class:`Fields` parses a spec once and matches one sample's member names in O(members),
with no per-sample allocation beyond the result. It is used by the CPU reader
(``ShardDataset(fields=...)``) and by ``DaliLoader(fields=...)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .errors import DecodeError

__all__ = ["FieldSpec", "Fields", "MissingFieldError"]

FieldSpec = Mapping[str, str] | Sequence[str]


class MissingFieldError(DecodeError, KeyError):
    """A sample has no member for a requested field. :meth:`Fields.match` raises it with a plain
    message (the fields asked for, the members present); the reader raises it again with the
    shard and key. A :class:`~shardstream.errors.DecodeError`, so ``on_error="skip"`` skips
    such samples (counted), and a ``KeyError``."""

    def __str__(self) -> str:  # KeyError's own quotes the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Fields:
    """A parsed field spec.

    Attributes:
        names: output names in order (dict keys; for a tuple spec ``"0"``, ``"1"``, ...).
        alternatives: per field, the lower-cased extensions it accepts, in preference order.
        as_tuple: whether samples become tuples (a sequence spec) or dicts (a mapping spec).
        spec: the spec as given, normalised to a dict or a tuple of strings (for errors, repr).
    """

    names: tuple[str, ...]
    alternatives: tuple[tuple[str, ...], ...]
    as_tuple: bool
    spec: dict[str, str] | tuple[str, ...]

    @classmethod
    def parse(cls, spec: FieldSpec | Fields) -> Fields:
        """Parse ``{"name": "ext;ext", ...}`` or ``("ext;ext", ...)``.

        Raises:
            TypeError: ``spec`` is neither a mapping nor a sequence of strings (a bare string
                is refused: write ``("jpg;png",)`` for one field).
            ValueError: no fields, an empty alternative, a name starting with ``__``, or a
                name given twice; the message quotes the spec.
        """
        if isinstance(spec, Fields):
            return spec
        if isinstance(spec, Mapping):
            items = [(name, alts) for name, alts in spec.items()]
            as_tuple = False
        elif isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
            items = [(str(i), alts) for i, alts in enumerate(spec)]
            as_tuple = True
        else:
            raise TypeError(
                f"fields={spec!r} must be a dict {{name: 'ext;ext'}} or a tuple ('ext;ext', ...); "
                "for one field write a tuple of one: ('jpg;png',)"
            )
        if not items:
            raise ValueError(f"fields={spec!r} names no field")
        names: list[str] = []
        alternatives: list[tuple[str, ...]] = []
        for name, alts in items:
            if not isinstance(name, str) or not isinstance(alts, str):
                raise TypeError(f"fields={spec!r}: names and alternatives must be strings, got {name!r}: {alts!r}")
            if name.startswith("__"):
                raise ValueError(f"fields={spec!r}: {name!r} is reserved (names starting with '__' are sample fields)")
            if name in names:
                raise ValueError(f"fields={spec!r}: {name!r} is given twice")
            choice = tuple(part.strip().lower().lstrip(".") for part in alts.split(";"))
            if not alts.strip() or any(not part for part in choice):
                raise ValueError(f"fields={spec!r}: {name!r} has an empty alternative in {alts!r}")
            names.append(name)
            alternatives.append(choice)
        normalised: dict[str, str] | tuple[str, ...] = (
            tuple(alts for _, alts in items) if as_tuple else {name: alts for name, alts in items}
        )
        return cls(tuple(names), tuple(alternatives), as_tuple, normalised)

    def match(self, members: Iterable[str]) -> list[str]:
        """For each field, the member name (as in the sample) it takes: the member whose
        lower-cased last extension part is the field's first alternative present (an
        alternative with a dot, ``"seg.png"``, matches the whole extension or its last parts:
        ``seg.png``, ``left.SEG.PNG``).

        Raises:
            MissingFieldError: a field matches no member; the message lists the fields asked
                for and the members present (sample fields ``__*`` left out).
        """
        names = [m for m in members if not m.startswith("__")]
        by_kind: dict[str, str] = {}
        for member in names:
            kind = member.rsplit(".", 1)[-1].lower()
            by_kind.setdefault(kind, member)  # the first member of a kind, in sample order
        chosen: list[str] = []
        for name, alts in zip(self.names, self.alternatives):
            for alt in alts:
                member = by_kind.get(alt) if "." not in alt else _dotted(names, alt)
                if member is not None:
                    chosen.append(member)
                    break
            else:
                label = f"field {alts[0]!r}" if self.as_tuple else f"field {name!r}"
                raise MissingFieldError(
                    f"{label} ({';'.join(alts)}) matches no member; asked for fields={self.spec!r}, "
                    f"the sample has members {sorted(names)}"
                )
        return chosen

    def shape(self, values: Sequence[object], extra: Mapping[str, object] | None = None) -> object:
        """The output sample: a tuple of ``values`` in field order, or a dict of the field names
        (with ``extra``, e.g. ``__key__``, added to a dict; a tuple carries none)."""
        if self.as_tuple:
            return tuple(values)
        out = dict(zip(self.names, values))
        if extra:
            out.update(extra)
        return out


def _dotted(members: Sequence[str], alt: str) -> str | None:
    """The first of ``members`` whose lower-cased name is ``alt`` or ends with ``"." + alt``."""
    for member in members:
        lowered = member.lower()
        if lowered == alt or lowered.endswith("." + alt):
            return member
    return None
