"""Node ids, router origins and node-token checks (ROUTER.md §3), shared by router and node."""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from urllib.parse import urlsplit

from kcoral.protocol.headers import PRINTABLE_TOKEN
from kcoral_server.front_door.callers import Identity

NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_FRAME_DATA = 262144
MAX_GRPC_MESSAGE = 262144 + 65536
PROTOCOL_VERSION = 1


def is_valid_node_id(value: str) -> bool:
    """1–64 characters, first ASCII alphanumeric, others ``[A-Za-z0-9_.-]``."""
    return NODE_ID_PATTERN.fullmatch(value) is not None and value.isascii()


def node_token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a node token, or None. Nodes send it in gRPC metadata, which
    carries printable ASCII only: a token with a newline (a token file written with
    ``echo``) was taken by the router, and its nodes' streams then failed in gRPC itself,
    retried without end."""
    if not token:
        return "must not be empty"
    if PRINTABLE_TOKEN.fullmatch(token) is None:
        return "must be printable ASCII without spaces (a trailing newline?): nodes send it in gRPC"
    return None


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


@dataclass(frozen=True)
class NodeGrant:
    """The node ids a presented node token opens (ROUTER §3): every id (the shared token, or
    a router without node tokens), one id, or, for a ``PREFIX*`` line, every id that starts
    with ``PREFIX``."""

    pattern: str | None = None  # None: every node id
    prefix: bool = False

    def opens(self, node_id: str) -> bool:
        if self.pattern is None:
            return True
        return node_id.startswith(self.pattern) if self.prefix else node_id == self.pattern

    def __str__(self) -> str:
        if self.pattern is None:
            return "every node id"
        return f"node ids {self.pattern}*" if self.prefix else f"node id {self.pattern}"


EVERY_NODE = NodeGrant()


@dataclass(frozen=True)
class NodeTokens:
    """The router's per-node tokens, from ``--node-token-file`` lines ``NODE_ID TOKEN``
    (``NODE_ID`` may end in ``*``: every id with that prefix). Checked in constant time per
    token; the tokens never appear in ``repr``."""

    entries: tuple[tuple[bytes, NodeGrant], ...] = field(repr=False)

    def grant(self, bearer: bytes) -> NodeGrant | None:
        """What the ``Bearer <token>`` value opens, or None (every entry is compared)."""
        found = None
        for expected, grant in self.entries:
            if hmac.compare_digest(bearer, expected):
                found = grant
        return found


def parse_node_tokens(text: str) -> NodeTokens:
    """``NODE_ID TOKEN`` lines (``#`` comments and blank lines skipped); ``ValueError`` names
    the bad line. Each token once, and no two lines may open the same node id: an exact id
    inside a listed prefix, or nested prefixes, are refused (who may act as a node would
    otherwise depend on which line was meant)."""
    grants: list[tuple[int, str, NodeGrant]] = []
    tokens: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 2:
            raise ValueError(f"line {number}: expected 'NODE_ID TOKEN' (or 'PREFIX* TOKEN')")
        name, token = fields
        prefix = name.endswith("*")
        pattern = name[:-1] if prefix else name
        if prefix and not pattern:
            raise ValueError(f"line {number}: '*' alone opens every node id; use --node-token")
        if not is_valid_node_id(pattern + "0" if prefix else pattern):
            raise ValueError(f"line {number}: invalid node id {name!r}")
        if token in tokens:
            raise ValueError(f"line {number}: this token is already used on an earlier line")
        problem = node_token_problem(token)
        if problem:
            raise ValueError(f"line {number}: the token {problem}")
        tokens.add(token)
        grants.append((number, token, NodeGrant(pattern, prefix)))
    if not grants:
        raise ValueError("holds no 'NODE_ID TOKEN' line")
    ordered = sorted(grants, key=lambda item: (item[2].pattern or "", not item[2].prefix))
    for (first, _, a), (second, _, b) in pairwise(ordered):
        assert a.pattern is not None and b.pattern is not None
        if (a.prefix and b.pattern.startswith(a.pattern)) or a.pattern == b.pattern:
            lines = sorted((first, second))
            raise ValueError(
                f"lines {lines[0]} and {lines[1]} open the same node ids ({a} and {b})"
            )
    return NodeTokens(tuple((f"Bearer {t}".encode(), grant) for _, t, grant in grants))


def node_grant(
    metadata_value: str | bytes | None, shared: str | None, per_node: NodeTokens | None
) -> NodeGrant | None:
    """What a node presenting ``metadata_value`` may open: with neither a shared token nor
    per-node tokens every id (an open router); the shared token opens every id; a per-node
    token its own ids; anything else None (``UNAUTHENTICATED``)."""
    if shared is None and per_node is None:
        return EVERY_NODE
    if metadata_value is None:
        return None
    if isinstance(metadata_value, str):
        metadata_value = metadata_value.encode("utf-8", "surrogateescape")
    if shared is not None and bearer_matches(metadata_value, shared):
        return EVERY_NODE
    return per_node.grant(metadata_value) if per_node is not None else None


def node_token_clash(
    client_tokens: Mapping[str, Identity], shared: str | None, per_node: NodeTokens | None
) -> str | None:
    """Why these client tokens (token -> identity) cannot be served beside the node tokens,
    or None: a client token that is also a node token lets every holder act as a node and
    receive the other identities' programs, what node tokens exist to prevent (§3). Where
    nodes need no token (no node token at all), there is nothing to guard."""
    if shared is None and per_node is None:
        return None
    for token, who in client_tokens.items():
        if node_grant(f"Bearer {token}", shared, per_node) is not None:
            return f"the token of {who.name!r} is also a node token"
    return None
