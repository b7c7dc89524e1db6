"""The per-sample stage of a reader: what ``ShardDataset(decode=..., fields=...)`` does to each
sample, composed once into one callable (:func:`make_decoder`) that the reader calls as its
``decode`` (:class:`~shardstream.reading.reader.ReadOptions`), so ``on_error="skip"`` covers all
of it.

With ``fields``, one sample goes through :class:`PickedSamples`:

1. **pick**: each field's member (:meth:`shardstream.fields.Fields.match`); a sample without
   one raises :class:`~shardstream.fields.MissingFieldError` (a ``DecodeError``) naming the
   shard, the key, the fields asked for and the members it has;
2. **decode**: only the picked members, each by the extension of the member that matched (a
   ``.JPEG`` as a ``.jpg``; ``cls`` to ``int``), by a :class:`~.cpu.CpuDecoder` (``decode=None``:
   bytes as they are);
3. **name**: a dict of the field names (``__key__``, ``__shard__`` and a mixture's
   ``__source__`` kept), or a tuple in field order (nothing else);
4. **transform**: the CpuDecoder's ``transform``, on the named sample.

A custom ``decode`` callable takes the place of 2 and 4: it gets the picked sample, a dict of
``__key__``, ``__shard__`` (a mixture's ``__source__``) and each field's raw bytes under the
field's name (a tuple spec's fields are named by position: ``"0"``, ``"1"``, ...). What it returns
is handed on; with a tuple spec, a dict it returns becomes the tuple of its fields' values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, get_args

from ..fields import Fields, MissingFieldError
from .cpu import CpuDecoder, ImageFormat
from .protocol import FieldDecoder, named_decoder, register_decoder

__all__ = ["PickedSamples", "make_decoder"]

Sample = dict[str, Any]

# The names decode= takes: CpuDecoder's image formats. A new named decoder is registered here.
for _format in get_args(ImageFormat):
    register_decoder(_format, partial(CpuDecoder, _format))


class PickedSamples:
    """The stage of a reader with ``fields`` (module doc). Picklable, built once.

    Args:
        fields: the parsed spec.
        decoder: decodes the picked members and transforms the named sample (a
            :class:`~.protocol.FieldDecoder`: a :class:`~.cpu.CpuDecoder`); None: raw bytes.
        custom: a user's ``decode`` callable instead of ``decoder`` (module doc).
    """

    def __init__(
        self, fields: Fields, *, decoder: FieldDecoder | None = None, custom: Callable[[Sample], Any] | None = None
    ) -> None:
        self.fields, self.decoder, self.custom = fields, decoder, custom

    def __repr__(self) -> str:
        return f"PickedSamples({self.fields.spec!r}, decoder={self.decoder or self.custom!r})"

    def __call__(self, sample: Sample) -> Any:
        fields = self.fields
        try:
            members = fields.match(sample)
        except MissingFieldError as exc:
            raise MissingFieldError(
                f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}: {exc}; add the alternative the "
                "sample has to fields=, or pass on_error='skip' to skip such samples (counted in stats().skipped)"
            ) from None
        extra = {name: value for name, value in sample.items() if name.startswith("__")}
        if self.custom is not None:
            picked = dict(extra)
            picked.update(zip(fields.names, (sample[m] for m in members)))
            out = self.custom(picked)
            if fields.as_tuple and isinstance(out, Mapping):
                return tuple(out[name] for name in fields.names)
            return out
        decoder = self.decoder
        if decoder is None:
            return fields.shape([sample[m] for m in members], extra)
        named = fields.shape([decoder.decode_field(sample, m) for m in members], extra)
        return named if decoder.transform is None else decoder.transform(named)


def make_decoder(
    decode: ImageFormat | Callable[[Sample], Any] | None,
    *,
    fields: Mapping[str, str] | Sequence[str] | Fields | None = None,
) -> Callable[[Sample], Any] | None:
    """The per-sample stage of ``ShardDataset(decode=..., fields=...)`` (module doc): without
    ``fields``, ``None`` (raw bytes), a callable used as is, or a decoder of a registered name
    (:func:`~.protocol.register_decoder`: :class:`CpuDecoder`'s formats); with ``fields``, a
    :class:`PickedSamples` (which decodes only the picked members with a
    :class:`~.protocol.FieldDecoder`, and gives a user's other callable the picked sample).

    Raises:
        ValueError: an unknown name (the message lists the choices), or a bad ``fields``
            (:meth:`Fields.parse`). TypeError: ``fields`` is neither a dict nor a tuple.
    """
    if decode is not None and not callable(decode):
        decode = named_decoder(decode)
    if fields is None:
        return decode
    spec = Fields.parse(fields)
    if decode is None or isinstance(decode, FieldDecoder):
        return PickedSamples(spec, decoder=decode)
    return PickedSamples(spec, custom=decode)
