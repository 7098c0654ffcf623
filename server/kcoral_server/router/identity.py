"""Node ids, router origins and node-token checks (ROUTER.md §3), shared by router and node."""

from __future__ import annotations

import hmac
import re
from urllib.parse import urlsplit

NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_FRAME_DATA = 262144
MAX_GRPC_MESSAGE = 262144 + 65536
PROTOCOL_VERSION = 1


def is_valid_node_id(value: str) -> bool:
    """1–64 characters, first ASCII alphanumeric, others ``[A-Za-z0-9_.-]``."""
    return NODE_ID_PATTERN.fullmatch(value) is not None and value.isascii()


def parse_router_origin(value: str) -> tuple[str, str, int, bool]:
    """Split a router origin into ``(origin, host, port, tls)``; raise ``ValueError``.

    Only a bare ``http(s)://host[:port]`` (a lone trailing ``/`` allowed) is accepted.
    """
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"invalid router origin {value!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"invalid router origin {value!r}: scheme must be http or https")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "?" in value:
        raise ValueError(f"invalid router origin {value!r}: no path, query or fragment allowed")
    if "#" in value:
        raise ValueError(f"invalid router origin {value!r}: no path, query or fragment allowed")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ValueError(f"invalid router origin {value!r}: no user info allowed")
    host = parts.hostname
    if not host:
        raise ValueError(f"invalid router origin {value!r}: missing host")
    tls = parts.scheme == "https"
    if port is None:
        port = 443 if tls else 80
    origin = f"{parts.scheme}://{parts.netloc}"
    return origin, host, port, tls


def bearer_matches(metadata_value: str | bytes | None, token: str | None) -> bool:
    """Constant-time check of an ``authorization: Bearer <token>`` value (no token = open)."""
    if token is None:
        return True
    if metadata_value is None:
        return False
    if isinstance(metadata_value, str):
        metadata_value = metadata_value.encode("utf-8", "surrogateescape")
    return hmac.compare_digest(metadata_value, f"Bearer {token}".encode())
