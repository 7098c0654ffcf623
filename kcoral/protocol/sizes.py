"""Sizes in bytes as a person types them: ``256M``, ``4GiB``, ``1K`` or plain ``268435456``.

One parser for the server's size options (``kcoral server --max-request-bytes``) and the
client's (``kcoral run --output-limit-bytes``), so a size means the same at both ends: the
client refused ``1K``, which the server's own options accept.
"""

from __future__ import annotations

import re

#: the units a size may end in, binary, and how they read in a message
SIZE_UNITS_TEXT = "a whole number of bytes, or one ending in K, M, G or T, binary: 256M, 4G, 4GiB"
# A whole number, optionally K, M, G or T, binary ("256M", "4GiB"). "GB" is refused: it reads
# as 10**9 to some and 2**30 to others.
_SIZE = re.compile(r"(-?[0-9]+)(?:([KMGT])(?:iB)?)?", re.ASCII | re.IGNORECASE)
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """A size in bytes: a plain integer, or one ending in ``K``, ``M``, ``G`` or ``T``
    (KiB, MiB, GiB, TiB; ``256M``, ``4G``, ``512KiB``; ``GB`` is refused as ambiguous)."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(f"not a size (a whole number, or one with K, M, G or T): {text!r}")
    unit = match.group(2)
    return int(match.group(1)) * (_UNITS[unit.upper()] if unit else 1)
