"""A strict little PNG reader for the pictures ``kcoral_jupyter.images`` writes, for the
tests of tests/jupyter."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def decode_png(data: bytes) -> np.ndarray:
    """A strict little PNG reader for the writer's own output (RGB8, filter 0)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = body
        offset += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2) and b"IEND" in chunks
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, -1)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(height, width, 3)
