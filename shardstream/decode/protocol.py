"""What a decoder is: the per-sample :class:`Decoder` a reader calls, and the batched
:class:`BatchDecoder` (a GPU decoder's graph) that :class:`shardstream.gpu.GpuLoader` runs,
with its per-image CPU twin :class:`CpuFallback`; and the names ``ShardDataset(decode=...)``
takes (:func:`register_decoder`).

A new per-sample decoder is one class with ``__call__(sample)`` (and ``decode_field`` /
``transform``, :class:`FieldDecoder`, to decode only the fields ``fields=`` picks), plus one
:func:`register_decoder` line for a name (the built-in ones are registered in
:mod:`.stage`). A new GPU decoder (nvImageCodec, torchvision's ``decode_jpeg(device="cuda")``)
is one :class:`BatchDecoder`: :class:`~shardstream.gpu.GpuLoader` does the rest (fields,
reading workers, the feed thread, CPU fallback, skipping, shutdown); DALI's is
``shardstream.dali._DaliGraph``.

Images, by decoder:

- per sample (:class:`~.cpu.CpuDecoder`'s formats): ``"pil"`` an RGB ``PIL.Image.Image``;
  ``"numpy"`` a ``numpy.ndarray`` ``(H, W, 3)`` ``uint8``; ``"torch"`` a CPU ``torch.Tensor``
  ``(3, H, W)`` ``torch.uint8``; on the CPU, in the process that reads (a DataLoader worker);
- batched (:meth:`BatchDecoder.batches`): images ``(B, C, H, W)`` (NCHW) of the decoder's
  dtype on its :attr:`~BatchDecoder.device`, labels ``int64`` ``(B,)`` on the same device;
- CPU fallback (:meth:`CpuFallback.decode`): one image, a CPU ``torch.Tensor`` ``(C, H, W)``
  ``torch.uint8`` of the batched output's ``H`` and ``W``, before :meth:`BatchDecoder.finish`.

Nothing in :mod:`shardstream.decode` imports torch (an import-linter contract): tensors are
made with the torch the process has loaded (:func:`.tensors.loaded_torch`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BatchDecoder",
    "BatchSource",
    "CpuFallback",
    "Decoder",
    "FieldDecoder",
    "decoder_names",
    "named_decoder",
    "register_decoder",
]

Sample = dict[str, Any]


@runtime_checkable
class Decoder(Protocol):
    """A per-sample decoder: what a reader calls on each raw sample (``ShardDataset(decode=...)``),
    in the process that reads it (a DataLoader worker), on the CPU."""

    def __call__(self, sample: Sample) -> Any:
        """The decoded ``sample`` (module doc: images as PIL, numpy or torch), or what its
        ``transform`` makes of it.

        Raises:
            DecodeError: a member cannot be decoded (``on_error="skip"`` skips the sample);
                names the shard, the key and the member.
        """
        ...


@runtime_checkable
class FieldDecoder(Decoder, Protocol):
    """A :class:`Decoder` that decodes one member at a time, so that with ``fields=`` only the
    picked members are decoded, then the named sample transformed
    (:class:`~.stage.PickedSamples`)."""

    transform: Callable[[Any], Any] | None

    def decode_field(self, sample: Sample, member: str) -> Any:
        """``sample[member]`` decoded by the member's extension.

        Raises:
            DecodeError: it cannot be decoded; names the shard, the key and the member.
        """
        ...


class BatchSource(Protocol):
    """Where a :class:`BatchDecoder` takes its batches from (the loader's feed)."""

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The next batch: each image's encoded bytes (a 1-D ``uint8`` array) and each label
        (an ``int64`` array of shape ``(1,)``), ``B`` of each (``B`` the batch size, less for a
        partial last batch).

        Raises:
            StopIteration: the epoch has ended (and again on every later call).
            Exception: the reader's error (the loader raises it as it is).
        """
        ...


@runtime_checkable
class CpuFallback(Protocol):
    """A batched decoder's CPU twin, one image at a time: which images it leaves to the CPU and
    what it makes of them, the same augmentation to the same output size. Picklable: it runs
    in the reader (a DataLoader worker or the loader's feed thread), with ``random``'s state
    there; also in the loader's process for batches the batched decoder failed on."""

    def problem(self, data: bytes) -> str | None:
        """None when the batched decoder takes ``data`` (encoded image bytes); else why it
        should be decoded on the CPU instead (a short phrase counted in ``stats()``)."""
        ...

    def decode(self, data: bytes, rng: Any) -> Any:
        """``data`` decoded and augmented on the CPU: a CPU ``torch.Tensor`` ``(C, H, W)``
        ``torch.uint8`` of the batched output's size; ``rng`` (``random``'s interface) draws
        its random choices.

        Raises:
            Exception: ``data`` cannot be decoded (Pillow raises OSError, ValueError,
                SyntaxError, ...); the loader applies ``on_error``.
        """
        ...


@runtime_checkable
class BatchDecoder(Protocol):
    """A batched decoder (a GPU decoder's graph) that :class:`shardstream.gpu.GpuLoader` feeds
    whole batches of encoded images and labels.

    Attributes:
        name: the decoder's name in messages and counters (``"DALI"``: "DALI failed on its
            batch").
        device: the ``torch.device`` its batches are on.
        fallback: its CPU twin (picklable), for the images :meth:`CpuFallback.problem` sends
            to the CPU and for the batches it fails on.
        placeholder: an encoded image (a 1-D ``uint8`` array) it is fed in the place of an
            image decoded on the CPU (whose output then replaces it).
    """

    name: str
    device: Any
    fallback: CpuFallback
    placeholder: np.ndarray

    def batches(self, source: BatchSource) -> Iterator[tuple[Any, Any]]:
        """Builds the graph (an error here is raised as it is), and returns an iterator that
        takes batches from ``source`` until its StopIteration and yields, for each, in order,
        ``(images, labels)``: images ``(B, C, H, W)`` of the decoder's dtype and labels
        ``int64`` ``(B,)``, both on :attr:`device`. An error while iterating is a failed
        batch: the loader decodes the batches taken but not yet yielded with :attr:`fallback`
        and calls ``batches`` again with the same ``source`` (at most 3 times in a row); it
        closes the iterator when it leaves it early."""
        ...

    def finish(self, images: Any) -> Any:
        """CPU ``torch.uint8`` images ``(B, C, H, W)`` (:attr:`fallback`'s) as :meth:`batches`
        gives them: its dtype (e.g. normalised ``float32``), on :attr:`device`."""
        ...

    def close(self) -> None:
        """Release what the graph holds between epochs; a later :meth:`batches` builds it again."""
        ...


_NAMED: dict[str, Callable[[], Decoder]] = {}


def register_decoder(name: str, factory: Callable[[], Decoder]) -> None:
    """Make ``ShardDataset(decode=name)`` (and ``ShardMapDataset``) use ``factory()``.

    Raises:
        ValueError: ``name`` is already registered.
    """
    if name in _NAMED:
        raise ValueError(f"decoder {name!r} is already registered")
    _NAMED[name] = factory


def decoder_names() -> tuple[str, ...]:
    """The registered names, in the order they were registered (``("pil", "numpy", "torch")``)."""
    return tuple(_NAMED)


def named_decoder(name: Any) -> Decoder:
    """A new decoder of a registered name.

    Raises:
        ValueError: ``name`` is not registered (the message lists the names).
    """
    names = decoder_names()
    if name not in names:  # a tuple: an unhashable name is just not one of them
        raise ValueError(f"decode={name!r} must be None, a callable, or one of {names}")
    return _NAMED[name]()
