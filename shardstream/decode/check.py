"""A cheap structural check of encoded images before they reach a GPU decoder.

NVIDIA DALI's decoders (nvImageCodec, nvJPEG and the A100/H100 hardware JPEG decoder) are
stricter than libjpeg and Pillow: a JPEG that Pillow decodes without complaint (junk bytes
before a marker, a truncated Adobe APP14 segment, a damaged Photoshop APP13 block, a file cut
short) makes ``fn.decoders.image*`` fail, and a failed DALI pipeline cannot be used again.
:func:`gpu_jpeg_problem` walks a JPEG's marker segments (headers only: it never touches the
entropy-coded data, except to find the end-of-image marker with one ``bytes.rfind``) and
answers whether the file is a plain JPEG that DALI takes, or why it should be decoded on the
CPU instead. It reads at most a few hundred bytes of header for a typical photo: about a
microsecond per image.
"""

from __future__ import annotations

__all__ = ["gpu_jpeg_problem"]

# Start-of-frame markers DALI's GPU path takes: baseline, extended sequential, progressive
# (Huffman, 8-bit). Lossless (C3), hierarchical (C5-C7) and arithmetic-coded (C9-CF) go to the CPU.
_SOF_OK = {0xC0, 0xC1, 0xC2}
_SOF_ALL = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RST0-7: markers without a length


def gpu_jpeg_problem(data: bytes) -> str | None:
    """None when ``data`` is a structurally clean JPEG of a kind DALI's GPU decoders take;
    else why it is not (a short phrase for logs and counters): not a JPEG (PNG, WebP, GIF,
    ...), junk before a marker, a segment running past the end, an Adobe APP14 segment shorter
    than its 12 bytes, a Photoshop APP13 block that does not fit, a frame that is not 8-bit
    baseline or progressive with 1 or 3 components (CMYK, 12-bit, lossless, arithmetic), no
    start of scan, or no end-of-image marker after it (a file cut short).

    It checks structure only: an image that passes can still fail to decode (DaliLoader then
    decodes its batch on the CPU), and one that fails may still be decodable by Pillow.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return "not a JPEG"
    i = 2
    frame = False
    while True:
        if i + 1 >= n:
            return "ends before its start of scan"
        if data[i] != 0xFF:
            return f"junk before a marker at byte {i}"
        marker = data[i + 1]
        if marker == 0xFF:
            return f"fill bytes before a marker at byte {i}"
        if marker in _STANDALONE:
            i += 2
            continue
        if i + 3 >= n:
            return "ends inside a marker segment"
        length = (data[i + 2] << 8) | data[i + 3]
        end = i + 2 + length
        if length < 2 or end > n:
            return f"marker 0x{marker:02X} segment at byte {i} runs past the end"
        body = data[i + 4 : end]
        if marker == 0xEE and body[:5] == b"Adobe":
            if len(body) < 12:
                return "truncated Adobe APP14 segment"
        elif marker == 0xED and body[:14] == b"Photoshop 3.0\x00":
            problem = _photoshop_problem(body[14:])
            if problem:
                return problem
        elif marker in _SOF_ALL:
            if marker not in _SOF_OK:
                return f"frame type 0x{marker:02X} (not baseline or progressive)"
            if len(body) < 6:
                return "truncated frame header"
            precision, components = body[0], body[5]
            if precision != 8:
                return f"{precision}-bit samples"
            if components not in (1, 3):
                return f"{components} components (CMYK or YCCK)"
            frame = True
        elif marker == 0xDA:
            if not frame:
                return "a scan before any frame header"
            if data.rfind(b"\xff\xd9", end) < 0:
                return "no end-of-image marker (cut short)"
            return None
        elif marker == 0xD9:
            return "end of image before any scan"
        i = end


def _photoshop_problem(blocks: bytes) -> str | None:
    """Why the image resource blocks of a Photoshop APP13 segment do not fit, or None."""
    i, n = 0, len(blocks)
    while i < n:
        if n - i < 4 and not blocks[i:].strip(b"\x00"):
            return None  # padding at the end
        if blocks[i : i + 4] != b"8BIM":
            return "damaged Photoshop APP13 segment"
        if i + 7 > n:
            return "truncated Photoshop APP13 segment"
        name_length = blocks[i + 6]
        name_end = i + 6 + 1 + name_length
        name_end += (name_end - (i + 6)) % 2  # the name (Pascal string) is padded to an even size
        if name_end + 4 > n:
            return "truncated Photoshop APP13 segment"
        size = int.from_bytes(blocks[name_end : name_end + 4], "big")
        i = name_end + 4 + size + (size % 2)
        if i > n:
            return "truncated Photoshop APP13 segment"
    return None
