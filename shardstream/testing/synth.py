"""Procedural, photo-like image-classification dataset (landscape scenes as JPEGs) for demos and tests.

Vectorised numpy composes sky gradients, ridges, soft shapes, lighting and a vignette on a canvas a
quarter of the final size; upscaling softens it like a lens and sensor-like grain is added before JPEG
encoding. Everything derives from ``seed``: the same arguments give byte-identical files.
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageFilter

__all__ = ["CLASS_NAMES", "make_image_dataset"]

CLASS_NAMES: tuple[str, ...] = (
    "sunset",
    "forest",
    "ocean",
    "desert",
    "snow",
    "night_city",
    "meadow",
    "canyon",
    "lake",
    "storm",
)
_DOWN = 4  # the composition canvas is this many times smaller than the output image
_GRAIN = (0, 1, 0, 1, 0, 2, 0, 1, 1, 2)  # sensor grain level per class (night and storm are noisier)
_F = np.float32
_HEADROOM = 16  # largest grain amplitude; luma is kept within [16, 239] before grain is added
_YCC = np.array([(0.299, 0.587, 0.114), (-0.168736, -0.331264, 0.5), (0.5, -0.418688, -0.081312)], _F) * 255


def _col(rng, rgb, jitter=0.06):
    c = np.asarray(rgb, _F) / 255 * _F(1 + rng.normal(0, jitter)) * (1 + rng.normal(0, jitter / 3, 3)).astype(_F)
    return np.clip(c, 0, 1).reshape(3, 1, 1)  # images are channel-first (3, h, w) while composing


def _grad(t, top, bot, gamma=1.0):
    t = np.clip(t, 0, 1)
    return top + (bot - top) * (t if gamma == 1 else t ** _F(gamma))


def _paint(a, mask, color):
    a += mask * (color - a)


def _soft(d, width=0.015):
    return np.clip(0.5 + d / width, 0, 1)


def _ridge(rng, x, base, amp, octaves=5, f0=1.5, rough=0.5):
    """Height (y grows downwards) of a random 1-D landscape profile evaluated at ``x``."""
    h = np.zeros_like(x)
    for k in range(octaves):
        f = f0 * 2**k * rng.uniform(0.8, 1.25)
        h += _F(rough**k * rng.uniform(0.5, 1)) * np.sin(_F(2 * np.pi * f) * x + _F(rng.uniform(0, 6.3)))
    return _F(base) - _F(amp / (2 - rough)) * h


@functools.lru_cache(maxsize=1024)
def _upsampler(n, size):
    """(size, n) matrix that resamples n grid values to size points with a cubic B-spline."""
    t = np.abs(np.linspace(0, n - 1, size)[:, None] - np.arange(n))
    k = np.where(t < 1, (4 - 6 * t**2 + 3 * t**3) / 6, np.maximum(2 - t, 0) ** 3 / 6)
    return (k / k.sum(1, keepdims=True)).astype(_F)


def _fbm(rng, shape, cells=4, octaves=3):
    """Smooth value noise in [0, 1] (mean 0.5): octaves of random grids, B-spline upsampled."""
    out = _F(0)
    for k in range(octaves):
        n = cells * 2**k + 1
        out = out + _F(0.5**k) * (_upsampler(n, shape[0]) @ rng.random((n, n), dtype=_F) @ _upsampler(n, shape[1]).T)
    return np.clip((out - _F(1 - 0.5**octaves)) * _F(1.5 / (2 - 0.5 ** (octaves - 1))) + _F(0.5), 0, 1)


def _glow(x, y, cx, cy, r, ar):
    return np.exp(-(((x - cx) * ar) ** 2 + (y - cy) ** 2) / _F(r * r))


def _scene(cls, rng, x, y, ar):
    """Composes class ``cls`` in [0, 1] RGB; ``x`` is a (1, w) row, ``y`` an (h, 1) column."""
    shape, u = (y.shape[0], x.shape[1]), rng.uniform
    tex = _fbm(rng, shape, 8, 2)  # ground/rock texture
    hz = u(
        *(
            (0.55, 0.72),
            (0.55, 0.8),
            (0.35, 0.5),
            (0.35, 0.5),
            (0.5, 0.7),
            (0.6, 0.8),
            (0.4, 0.55),
            (0.6, 0.6),
            (0.5, 0.62),
            (0.6, 0.8),
        )[cls]
    )
    sky = (
        ((45, 30, 95), (250, 140, 55)),
        ((80, 140, 215), (200, 222, 238)),
        ((50, 110, 200), (190, 215, 235)),
        ((85, 140, 215), (225, 225, 215)),
        ((55, 110, 200), (190, 215, 240)),
        ((4, 6, 22), (70, 45, 60)),
        ((60, 130, 225), (185, 215, 240)),
        ((70, 130, 215), (175, 200, 225)),
        ((90, 150, 220), (200, 222, 238)),
        ((40, 45, 55), (110, 115, 115)),
    )
    a = np.zeros((3, *shape), _F) + _grad(y / hz, _col(rng, sky[cls][0]), _col(rng, sky[cls][1]), u(0.7, 1.6))
    if cls in (2, 4, 6, 8):  # soft cumulus clouds
        _paint(a, _soft(_fbm(rng, shape, 3, 4) - u(0.45, 0.6), 0.2) * (y < hz) * 0.85, _col(rng, (245, 245, 248)))
    if cls == 0:  # sunset: low sun with glow, streaky clouds, dark hill silhouettes
        cx, cy, r = u(0.2, 0.8), hz - u(0.0, 0.12), u(0.04, 0.07)
        a += _glow(x, y, cx, cy, r * 5, ar) * _col(rng, (150, 70, 20))
        _paint(a, _soft(r - np.sqrt(((x - cx) * ar) ** 2 + (y - cy) ** 2)), _col(rng, (255, 235, 170)))
        _paint(
            a,
            0.5 * _soft(_fbm(rng, shape, 2, 3) * np.sin(y * _F(u(12, 25))) ** 2 - 0.45, 0.3) * (y < hz),
            _col(rng, (120, 50, 80)),
        )
        _paint(a, _soft(y - _ridge(rng, x, hz, u(0.03, 0.1))), _col(rng, (30, 18, 30)))
    elif cls in (1, 4, 8):  # forest of conifers / snowy mountains / mountain lake
        if cls != 1:  # mountains with lit and shaded flanks
            big = _ridge(rng, x, hz - u(0.12, 0.3), u(0.12, 0.25), 3, 1.2)
            light = 0.5 + 0.5 * np.tanh(np.gradient(big, axis=1) * _F(x.shape[1] * 0.7))
            lit, dark = ((242, 246, 252), (150, 168, 205)) if cls == 4 else ((125, 135, 165), (70, 80, 110))
            rock = _grad(light, _col(rng, dark), _col(rng, lit)) * (0.75 + 0.45 * tex)
            _paint(rock, 0.7 * _soft(tex - u(0.62, 0.72), 0.05) * (cls == 4), _col(rng, (110, 115, 125)))  # bare rock
            _paint(a, _soft(y - big - _ridge(rng, x, 0, 0.04, 4, 6)), rock)
        layers = (
            ((0.5, (110, 150, 125)), (0.75, (50, 95, 55)), (1.0, (20, 55, 30)))
            if cls == 1
            else (((1.0, (25, 60, 40)),) if cls == 8 else ())
        )
        for depth, color in layers:
            base = hz + (1 - hz) * (depth - 0.5) * 0.6 if cls == 1 else hz
            n = int(12 * ar / depth)
            tops = base - rng.uniform(0.1, 0.45, (n, 1)) * depth * (0.3 if cls == 8 else 1)
            edge = tops + np.abs(x - rng.random((n, 1))) * ar / rng.uniform(0.2, 0.3, (n, 1))
            edge = np.minimum(_ridge(rng, x, base, 0.02, 3), edge.min(axis=0, initial=9, keepdims=True))
            _paint(a, _soft(y - edge.astype(_F)), _col(rng, color) * (0.8 + 0.4 * tex))
        if cls == 4:  # snow field
            _paint(
                a,
                _soft(y - _ridge(rng, x, hz, 0.03, 3)),
                _grad(y, _col(rng, (205, 218, 238)), _col(rng, (250, 250, 255))),
            )
        if cls == 8:  # calm water mirrors the scene above the horizon, with ripples
            rows = np.arange(shape[0])
            k = int(hz * (shape[0] - 1))
            src = np.where(rows > k, np.maximum(2 * k - rows, 0), rows)[:, None]
            cols = np.clip(np.arange(shape[1]) + (1.5 * np.sin(rows * 1.7))[:, None].astype(int), 0, shape[1] - 1)
            a = np.where((rows > k)[:, None], a[:, src, cols] * 0.65 + _col(rng, (20, 55, 75)) * 0.3, a)
    elif cls == 2:  # ocean: perspective waves with white crests
        d = np.maximum(y - hz, 0) + _F(0.01)
        sea = _grad((y - hz) / (1 - hz), _col(rng, (60, 110, 150)), _col(rng, (10, 45, 85)), 0.7)
        wave = np.sin(_F(u(2, 4)) / d + 3 * np.sin(x * _F(8 * ar) + _F(u(0, 6))))
        _paint(a, (y > hz).astype(_F), sea * (1 + 0.12 * wave))
        caps = _soft(wave - 0.8, 0.1) * _soft(tex - 0.6, 0.1) * (y > hz + 0.04) * _soft(hz + 0.4 * (1 - hz) - y, 0.2)
        _paint(a, 0.6 * caps, _col(rng, (225, 235, 240)))
    elif cls in (3, 6):  # desert dunes / meadow of rolling hills with flowers
        if cls == 3:
            a += _glow(x, y, u(0.1, 0.9), u(0.05, hz - 0.1), 0.15, ar) * _F(0.4)
        sand, dark = ((225, 170, 105), (150, 90, 50)) if cls == 3 else ((110, 170, 60), (40, 95, 25))
        for i, base in enumerate(np.linspace(hz, 0.95, 3 + (cls == 3))):
            r = _ridge(rng, x, base, u(0.03, 0.08), 3, 1.0)
            shade = np.clip((y - r) / _F(u(0.1, 0.3)), 0, 1) - 0.3 * np.tanh(np.gradient(r, axis=1) * _F(x.shape[1]))
            tint = _grad(shade, _col(rng, sand), _col(rng, dark)) * _F(0.9 + 0.1 * i / 3)
            _paint(a, _soft(y - r, 0.01), tint * (0.85 + 0.3 * tex))
        if cls == 6:  # flowers, denser towards the viewer
            dots = (rng.random(shape, dtype=_F) < 0.06 * np.clip((y - hz) * 2, 0, 1)).astype(_F)
            _paint(
                a, dots, np.array([(1, 0.9, 0.2), (1, 1, 1), (0.9, 0.2, 0.5)], _F)[rng.integers(0, 3), :, None, None]
            )
    elif cls == 5:  # night city: stars, skyline of lit windows, glow on the horizon
        _paint(a, (rng.random(shape) < 0.004) * (y < hz - 0.1) * _F(0.7), _F(1))
        iy, ix = np.indices(shape)
        lit = rng.random((shape[0] // 4 + 1, shape[1] // 3 + 1)) < u(0.2, 0.5)
        win = lit[iy // 4, ix // 3] & (iy % 4 < 2) & (ix % 3 < 2)
        for layer in range(2):  # hazy far blocks, then dark near blocks, each a run of buildings
            edges = np.cumsum(rng.uniform(0.04, 0.14, 30)) - u(0, 0.1)
            b = np.searchsorted(edges, x)
            top = (hz - rng.uniform(0.05, 0.5 - 0.2 * layer, 31)).astype(_F)[b]
            body = _col(rng, ((45, 40, 60), (15, 15, 25))[layer], 0.2)
            _paint(a, _soft(y - top, 0.005), body * rng.uniform(0.7, 1.3, 31).astype(_F)[b])
            glow = _col(rng, (255, 200, 120), 0.15) * _F(u(0.5, 1) - 0.3 * (1 - layer))
            _paint(a, (win & (y > top + 0.02)).astype(_F), glow)
        a += _glow(x, y, 0.5, 1.1, 0.35, ar / 2) * _col(rng, (120, 60, 20))
    elif cls == 7:  # canyon: layered red rock walls, narrow sky, shadowed floor
        left = _ridge(rng, y, u(0.15, 0.4), 0.06, 4, 1.0) + 0.25 * (1 - y) ** 2 * _F(u(-0.5, 1))
        right = _ridge(rng, y, u(0.6, 0.85), 0.06, 4, 1.0) - 0.25 * (1 - y) ** 2 * _F(u(-0.5, 1))
        strata = 1 + 0.15 * np.sin(y * _F(u(30, 60)) + 3 * _fbm(rng, shape, 4, 2))
        rock = _col(rng, (185, 90, 45)) * (strata * (0.8 + 0.4 * tex))
        _paint(a, _soft(left - x), rock * _F(1.1))
        _paint(a, _soft(x - right), rock * _F(0.6))
        _paint(a, _soft(y - _ridge(rng, x, u(0.75, 0.9), 0.03, 3)), _col(rng, (110, 70, 45)) * rock / rock.max())
    else:  # storm: churning dark clouds, maybe lightning, rain streaks, dark land
        a *= 0.45 + 0.9 * _fbm(rng, shape, 3, 4)
        if u() < 0.6:
            path = u(0.2, 0.8) + np.cumsum(rng.normal(0, 0.01, (shape[0], 1)), axis=0).astype(_F)
            bolt = np.exp(-((((x - path) * ar) / _F(0.012)) ** 2)) * (y < hz * u(0.6, 1.0))
            a += (bolt + 0.25 * _glow(x, y, path[0, 0], 0.1, 0.3, ar)) * _col(rng, (235, 235, 255))
        _paint(a, _soft(y - _ridge(rng, x, hz, 0.04)), _col(rng, (35, 42, 30)))
        iy, ix = np.indices(shape)
        a += _F(0.08) * (rng.random(shape[1]) > 0.9)[(ix + iy // 3) % shape[1]]
    return a


def make_image_dataset(
    root: str | os.PathLike,
    *,
    num_images: int = 2000,
    num_classes: int = 10,
    seed: int = 0,
    min_side_px: int = 256,
    max_side_px: int = 512,
    jpeg_quality: int = 90,
    progress: bool = False,
    cls_files: bool = True,
) -> int:
    """Writes a deterministic, photo-like JPEG image-classification dataset.

    Files are ``root/<class_name>/<index:06d>.jpg`` plus ``.cls`` (the class index as ASCII decimal, no
    newline); ``index`` runs over 0..num_images-1 and its class is ``index % num_classes``. Image
    ``index`` does not depend on ``num_images``, so a larger dataset extends a smaller one.

    Args:
        root: Output directory, created if missing.
        num_images: Number of images, at least 1.
        num_classes: Number of classes used, 1..len(CLASS_NAMES).
        seed: Non-negative seed; the same arguments give byte-identical files.
        min_side_px: Smallest width/height in pixels, at least 16.
        max_side_px: Largest width/height in pixels, at least ``min_side_px``.
        jpeg_quality: JPEG quality, 1..100.
        progress: Show a tqdm progress bar.
        cls_files: Write the ``.cls`` files; False: a tree of class folders and images only,
            for ``pack --labels-from-dirs`` (which writes each sample's ``cls`` itself).

    Returns:
        Total bytes written (JPEG plus any ``.cls`` files).

    Raises:
        ValueError: If an argument is out of range; the message names it.
    """
    limits = {
        "num_images": (num_images, 1, None),
        "num_classes": (num_classes, 1, len(CLASS_NAMES)),
        "seed": (seed, 0, None),
        "min_side_px": (min_side_px, 16, None),
        "max_side_px": (max_side_px, 16, None),
        "jpeg_quality": (jpeg_quality, 1, 100),
    }
    for name, (value, lo, hi) in limits.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an int, got {value!r}")
        if value < lo or (hi is not None and value > hi):
            raise ValueError(f"{name}={value} is out of range [{lo}, {'inf' if hi is None else hi}]")
    if max_side_px < min_side_px:
        raise ValueError(f"max_side_px={max_side_px} is smaller than min_side_px={min_side_px}")
    root = Path(root)
    for name in CLASS_NAMES[:num_classes]:
        (root / name).mkdir(parents=True, exist_ok=True)
    grain_rng, grains = np.random.default_rng([seed, 1, 0]), []
    for sigma in (5.5, 8.0, 12.0):  # luma-only sensor grain, slightly correlated, stored modulo 256
        g = np.clip(128 + grain_rng.normal(0, sigma, (max_side_px, max_side_px)), 0, 255).astype(np.uint8)
        g = np.asarray(Image.fromarray(g).filter(ImageFilter.GaussianBlur(0.6))).astype(np.int16) - 128
        g = (np.clip(g, -_HEADROOM, _HEADROOM) & 255).astype(np.uint8)
        tile = Image.frombytes("YCbCr", g.shape[::-1], np.stack([g, 0 * g, 0 * g], -1).tobytes())
        grains.append(
            [tile] + [tile.transpose(t) for t in (Image.Transpose.FLIP_LEFT_RIGHT, Image.Transpose.ROTATE_180)]
        )
    indices = range(num_images)
    if progress:
        from tqdm import tqdm

        indices = tqdm(indices, desc="synth images", unit="img")
    total = 0
    for i in indices:
        cls, rng = i % num_classes, np.random.default_rng([seed, 0, i])
        w, h = (int(v) for v in rng.integers(min_side_px, max_side_px + 1, 2))
        sw, sh = max(8, w // _DOWN), max(8, h // _DOWN)
        x, y = np.linspace(0, 1, sw, dtype=_F)[None, :], np.linspace(0, 1, sh, dtype=_F)[:, None]
        a = _scene(cls, rng, x, y, _F(sw / sh))
        vignette = 1 - _F(rng.uniform(0.3, 0.8)) * ((x - 0.5) ** 2 + (y - 0.5) ** 2)
        a = np.clip(
            a * vignette * (_F(rng.uniform(0.85, 1.15)) * (1 + rng.normal(0, 0.03, (3, 1, 1)))).astype(_F), 0, 1
        )
        # To JPEG's own full-range YCbCr; luma keeps headroom so adding grain modulo 256 (fast) never wraps.
        ycc = np.tensordot(_YCC, a, 1) + _F(128.5)
        ycc[0] = (ycc[0] - 128) * _F((255 - 2 * _HEADROOM) / 255) + _F(_HEADROOM)
        ycc = np.clip(ycc, 0, 255).astype(np.uint8).transpose(1, 2, 0)
        img = Image.frombytes("YCbCr", (sw, sh), ycc.tobytes())
        img = ImageChops.add_modulo(  # of a smaller and a larger image: result has the smaller size
            img.resize((w, h), Image.BILINEAR), grains[_GRAIN[cls]][rng.integers(3)]
        )
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=jpeg_quality)
        stem = root / CLASS_NAMES[cls] / f"{i:06d}"
        stem.with_suffix(".jpg").write_bytes(buf.getvalue())
        total += buf.tell()
        if cls_files:
            stem.with_suffix(".cls").write_bytes(str(cls).encode())
            total += len(str(cls))
    return total
