"""Will this image decode? A full decode with Pillow, for ``pack --check-images`` and
``verify --decode``: a truncated or damaged file is found before training, not during it."""

from __future__ import annotations

import io
import warnings

__all__ = ["IMAGE_EXTENSIONS", "image_problem"]

# The extensions CpuDecoder decodes as images (shardstream.decode.cpu), by the last dot part, lower-cased.
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "webp", "tif", "tiff"})


def image_problem(member_name: str, data: bytes) -> str | None:
    """None when ``member_name`` is not an image by its extension, or when Pillow decodes
    ``data`` whole; else why not, as a short phrase (``"image file is truncated (52 bytes not
    processed)"``, ``"cannot identify image file"``, ``"empty file"``).

    Decoding runs in Pillow's C code, which releases the GIL: threads check images in parallel.
    """
    if member_name.rsplit(".", 1)[-1].lower() not in IMAGE_EXTENSIONS:
        return None
    if not data:
        return "empty file"
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # EXIF and palette warnings: the pixels are what counts
            with Image.open(io.BytesIO(data)) as image:
                image.load()
    except Exception as exc:  # noqa: BLE001 - Pillow raises OSError, ValueError, SyntaxError, struct.error, ...
        reason = str(exc) or type(exc).__name__
        return "cannot identify image file" if reason.startswith("cannot identify image file") else reason
    return None
