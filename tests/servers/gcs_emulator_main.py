"""``gcp-storage-emulator``'s command line, with one fix: a multipart upload's content kept
byte for byte.

gcsfs sends a small object in one ``multipart/related`` request framed with bare line feeds;
the emulator reads it with Python's email parser, which takes a CR that ends the object for
half of the CRLF before the closing delimiter and drops it: an object of random bytes ending
in 0x0d was stored one byte short (1 object in 256, a flaky test; resumable uploads were never
affected). Here each part is cut by its own framing: its headers end at its first blank line
(CRLF CRLF, or LF LF as gcsfs writes), and its content loses that one line break before the
next delimiter. Every other request goes to the emulator's own reading. Run with the
arguments of ``python -m gcp_storage_emulator``.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from typing import Any

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main

_emulators_read_data = server._read_data


def _part(raw: bytes) -> tuple[dict[str, str], bytes]:
    """A body part's headers (lower-cased names) and its content."""
    crlf = raw.find(b"\r\n\r\n")
    lf = raw.find(b"\n\n")
    eol = b"\r\n" if crlf != -1 and (lf == -1 or crlf < lf) else b"\n"
    raw = raw.removeprefix(eol)
    head, _, content = raw.partition(eol + eol)
    headers = {}
    for line in head.decode("latin-1").split(eol.decode()):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    content = content.removesuffix(eol)
    if headers.get("content-transfer-encoding", "").lower() == "base64":
        content = base64.b64decode(content)
    return headers, content


def _read_data(request_handler: Any, query: Any) -> Any:
    content_type = request_handler.headers.get("Content-Type") or ""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/related") or found is None:
        return _emulators_read_data(request_handler, query)
    raw = server._decode_raw_data(server._read_raw_data(request_handler), request_handler)
    _, meta, media, *_ = raw.split(b"--" + found.group(1).encode())  # preamble, metadata, content, "--"
    headers, content = _part(media)
    return {
        "meta": json.loads(_part(meta)[1]),
        "content": content,
        "content-type": headers.get("content-type", "application/octet-stream"),
    }


server._read_data = _read_data

if __name__ == "__main__":
    main(sys.argv[1:])
