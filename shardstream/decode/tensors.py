"""The torch operations of :mod:`shardstream.decode`, done with the torch this process has
already loaded: nothing in the package imports torch (an import-linter contract keeps it so).

Why not an import: decoding to PIL images or numpy arrays needs no torch, and the decoders that
make tensors (``CpuDecoder("torch")``; a :class:`~.steps.RandomResizedCrop`'s antialiased
resize, which ``"numpy"`` uses too; its DALI-like :meth:`~.steps.RandomResizedCrop.augment`)
run where torch is loaded anyway: in a DataLoader worker, beside a ``ShardDataset`` or
``ShardMapDataset`` (torch classes), under a GPU loader. Elsewhere (a torch-free reader, a
packing job) asking for a tensor raises :class:`~shardstream.errors.MissingDependencyError`
saying to import torch, instead of importing it behind the caller's back.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["chw_uint8", "loaded_torch", "resized_chw_uint8"]


def loaded_torch() -> Any:
    """The ``torch`` module this process has loaded; never imports it.

    Raises:
        MissingDependencyError: (an ImportError) torch is not loaded here (or
            ``sys.modules["torch"] = None``): import torch first.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        raise MissingDependencyError(
            "decoding to torch tensors needs torch loaded in this process, and shardstream.decode never imports "
            "it: `import torch` first (ShardDataset, ShardMapDataset and a DataLoader do), or decode to 'numpy' "
            "or 'pil' without a RandomResizedCrop"
        )
    return torch


def chw_uint8(array: np.ndarray) -> Any:
    """An RGB image ``(H, W, 3)`` ``uint8`` as a CPU ``torch.Tensor`` ``(3, H, W)``
    ``torch.uint8``: a view of ``array`` (no copy; not contiguous).

    Raises:
        MissingDependencyError: torch is not loaded (:func:`loaded_torch`).
    """
    return loaded_torch().from_numpy(array).permute(2, 0, 1)


def resized_chw_uint8(array: np.ndarray, size_px: int) -> Any:
    """An RGB image ``(H, W, 3)`` ``uint8`` resized to ``size_px`` x ``size_px`` by torch's
    antialiased bilinear ``uint8`` kernel (about 3x faster than Pillow's on crops of photos,
    within a few levels of it): a contiguous CPU ``torch.Tensor`` ``(3, size_px, size_px)``
    ``torch.uint8``.

    Raises:
        MissingDependencyError: torch is not loaded (:func:`loaded_torch`).
    """
    torch = loaded_torch()
    batch = torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0)
    resized = torch.nn.functional.interpolate(batch, size=(size_px, size_px), mode="bilinear", antialias=True)
    return resized[0].contiguous()
