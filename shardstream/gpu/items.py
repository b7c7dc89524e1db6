"""Samples on their way to a batched decoder: which members hold the image and the label
(:class:`Members`), and each sample as an :class:`Item` (:class:`Encoder`): its encoded image
for the batched decoder, or the image decoded on the CPU by the decoder's
:class:`~shardstream.decode.protocol.CpuFallback`, or neither (a bad sample, skipped by
``on_error="skip"``). DataLoader workers send a batch of items in one shared-memory block
(:class:`SharedEncoder`). Nothing here imports torch or a decoder.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..decode.reasons import IMAGE_WAYS_OUT, why_undecodable
from ..errors import DecodeError
from ..fields import Fields, FieldSpec, MissingFieldError
from ..reading.batching import parse_label

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..collate import ByteBatch
    from ..decode.protocol import CpuFallback

__all__ = ["Default", "Encoder", "Item", "Members", "SharedEncoder"]


class Item(NamedTuple):
    """One sample on its way to a batch: ``data`` (encoded image bytes the batched decoder
    decodes) or ``cpu`` (the image already decoded and augmented on the CPU: ``torch.uint8``
    ``(C, H, W)``, the batch's size), or neither (undecodable or lacking a member, skipped by
    ``on_error="skip"``)."""

    data: bytes | np.ndarray | None  # an ndarray: a view into a worker's shared batch
    label: int
    cpu: torch.Tensor | None
    problem: str | None  # why it is not decoded by the batched decoder (None: it is)
    where: str  # "shard: sample 'key', member 'jpg'", for errors


class Default(str):
    """The default of ``image_ext`` / ``label_ext``: a ``str`` equal to it, told apart from the
    same value given by the caller (which ``fields=`` refuses beside it)."""


@dataclass(frozen=True)
class Members:
    """Which members of a sample hold the image and the label: the fields of ``fields=``
    (matched by :meth:`Fields.match`: case-insensitively, by the last dot part of the member's
    name, the first alternative present winning), or else the members named exactly
    ``image_ext`` and ``label_ext`` (None: no label, -1). ``owner`` is the loader's class
    name, in messages (``"DaliLoader"``)."""

    fields: Fields | None
    image: str  # image_ext; with fields, the name of the image field
    label: str | None  # label_ext; with fields, the name of the label field (None: no label)
    owner: str

    @classmethod
    def of(cls, fields: FieldSpec | None, image_ext: str, label_ext: str | None, *, owner: str) -> Members:
        """``fields=`` checked for the loader ``owner``, or the extension arguments.

        Raises:
            ValueError: ``fields`` with ``image_ext`` / ``label_ext`` given too, or a spec that is
                not one image field, or an image and a label field (the message quotes it).
        """
        if fields is None:
            return cls(None, str(image_ext), None if label_ext is None else str(label_ext), owner)
        given = [
            f"{name}={value!r}"
            for name, value in (("image_ext", image_ext), ("label_ext", label_ext))
            if not isinstance(value, Default)
        ]
        if given:
            raise ValueError(
                f"fields={fields!r} and {', '.join(given)} are both given: fields= replaces the extension "
                "arguments; pass one of them"
            )
        shapes = "{'image': 'jpg;jpeg;png', 'label': 'cls'} or ('jpg;jpeg;png', 'cls') (a label-less ('jpg;jpeg',))"
        try:
            parsed = Fields.parse(fields)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{owner}(fields=...): {exc}; {owner} takes {shapes}") from exc
        if parsed.as_tuple:
            if len(parsed.names) > 2:
                raise ValueError(
                    f"fields={fields!r} names {len(parsed.names)} fields; {owner} yields (images, labels): "
                    f"give the image field first, then the label field: {shapes}"
                )
            return cls(parsed, parsed.names[0], parsed.names[1] if len(parsed.names) == 2 else None, owner)
        if "image" not in parsed.names or not set(parsed.names) <= {"image", "label"}:
            raise ValueError(
                f"fields={fields!r}: {owner} takes the keys 'image' and, optionally, 'label' "
                f"(it yields (images, labels)), got {list(parsed.names)}: {shapes}"
            )
        return cls(parsed, "image", "label" if "label" in parsed.names else None, owner)

    def pick(self, sample: dict[str, Any]) -> tuple[str, str | None]:
        """The names of the sample's image member and label member (None: no label).

        Raises:
            MissingFieldError: (with ``fields``) the sample lacks one; names the shard, the key,
                the fields asked for and the members the sample has.
            DecodeError: (without) the same, naming the extension asked for.
        """
        if self.fields is None:
            for ext in (self.image, self.label):
                if ext is not None and ext not in sample:
                    raise DecodeError(
                        f"{sample.get('__shard__')}: sample {sample.get('__key__')!r} has no {ext!r} member "
                        f"(it has {sorted(k for k in sample if not k.startswith('__'))}); set image_ext / label_ext, "
                        "or pass fields=('jpg;jpeg', 'cls') to match extensions case-insensitively"
                    )
            return self.image, self.label
        try:
            chosen = dict(zip(self.fields.names, self.fields.match(sample)))
        except MissingFieldError as exc:  # again, with the shard and key, as the CPU reader does
            raise MissingFieldError(
                f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}: {exc}; add the alternative the "
                "sample has to fields=, or pass ShardDataset(on_error='skip') to skip such samples (counted in "
                f"{self.owner}.stats()['skipped'])"
            ) from None
        return chosen[self.image], None if self.label is None else chosen[self.label]


@dataclass(frozen=True)
class Encoder:
    """The DataLoader collate of the readers (workers, or a thread of this process): each
    sample's image bytes and label, and for an image the batched decoder would reject or
    cannot read (``fallback.problem``), the image decoded and augmented here by
    ``fallback`` instead. A worker sends a batch of them in one message. ``name`` is the
    batched decoder's, in messages."""

    members: Members
    fallback: CpuFallback
    on_error: str
    name: str

    def __call__(self, samples: list[dict[str, Any]]) -> list[Item]:
        return [self.item(sample) for sample in samples]

    from_samples = __call__  # a Batcher (shardstream.reading.batching)

    def item(self, sample: dict[str, Any]) -> Item:
        try:
            image, label_member = self.members.pick(sample)
        except (DecodeError, MissingFieldError) as exc:  # a member missing: a bad sample, as an undecodable one
            if self.on_error == "raise":
                raise
            return Item(None, -1, None, str(exc), f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}")
        data = sample[image]
        label = -1 if label_member is None else parse_label(sample, label_member)
        where = f"{sample.get('__shard__')}: sample {sample.get('__key__')!r}, member {image!r}"
        problem = self.fallback.problem(data)
        if problem is None:
            return Item(data, label, None, None, where)
        return self.on_cpu(data, label, problem, where)

    def on_cpu(self, data: bytes, label: int, problem: str, where: str) -> Item:
        """The item decoded by ``fallback``; undecodable: ``on_error`` ("raise": DecodeError)."""
        try:
            return Item(None, label, self.fallback.decode(data, random), problem, where)
        except Exception as exc:  # Pillow raises many kinds for bad input
            reason = why_undecodable(data, exc)
            checked = "" if not data else f" ({self.name}'s check: {problem})"
            error = DecodeError(f"{where}: no decoder can read this image: {reason}{checked}; {IMAGE_WAYS_OUT}")
            if self.on_error == "raise":
                raise error from exc
            return Item(None, label, None, str(error), where)


@dataclass(frozen=True)
class SharedEncoder:
    """The workers' collate: a batch of :class:`Item` s with the encoded images in one
    shared-memory block (:class:`~shardstream.collate.ByteBatch`), which crosses to this
    process without pickling; :meth:`items` gives the items back here, each image a numpy
    view into the block (which the batched decoder copies from)."""

    encoder: Encoder

    def __call__(self, samples: list[dict[str, Any]]) -> ByteBatch:
        return self.from_samples(samples)

    def from_samples(self, samples: list[dict[str, Any]]) -> ByteBatch:
        """The batch of ``samples`` (a :class:`~shardstream.reading.batching.Batcher`)."""
        from ..collate import ByteCollate  # here, not at the top: importing shardstream.gpu stays torch-free

        return ByteCollate()(
            [
                {
                    "__key__": x.where,
                    "data": b"" if x.data is None else x.data,
                    "encoded": x.data is not None,
                    "label": x.label,
                    "cpu": x.cpu,
                    "problem": x.problem,
                }
                for x in self.encoder(samples)
            ]
        )

    @staticmethod
    def items(batch: ByteBatch) -> Iterator[Item]:
        for where, data, encoded, label, cpu, problem in zip(
            batch.keys, batch.arrays("data"), batch["encoded"], batch["label"], batch["cpu"], batch["problem"]
        ):
            yield Item(data if encoded else None, label, cpu, problem, where)
