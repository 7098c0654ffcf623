"""Which headers cross the router, each way (ROUTER.md §8.4, §8.6).

Towards a node: the client's request headers less hop-by-hop ones and the client's own
credentials and browser headers, plus the identity the router checked and its request id
(``forwarded_headers``). Towards the client: only the headers of a node's answer that mean
something to a client (``relayed_response_head``).
"""

from __future__ import annotations

import tornado.httputil

from kcoral_server.front_door.callers import IDENTITY_HEADER, Identity
from kcoral_server.proto import kcoral_gateway_pb2 as pb

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The client's credentials and browser headers stay at the router (a node, rogue or not,
# never sees a client token); the identity the router checked travels instead, in
# X-KCoral-Identity, which the node believes only from its tunnel (ROUTER §3, §8.4). The
# router's browser guard has judged the page (``Origin``, fetch metadata): a node that saw
# ``Sec-Fetch-Site`` without the ``Origin`` the router allowed refused the page (403).
BROWSER_ONLY = frozenset({"origin", "sec-fetch-site", "sec-fetch-mode", "sec-fetch-dest"})
CLIENT_ONLY = frozenset({"authorization", "cookie", IDENTITY_HEADER.lower()}) | BROWSER_ONLY
# X-KCoral-Select is the router's to read (EXTENSIONS §14): it chose a node that fits, and
# the node never sees it (its own view of itself may differ from what it reported).
NOT_FORWARDED = (
    HOP_BY_HOP
    | CLIENT_ONLY
    | {"host", "expect", "x-kcoral-node", "x-kcoral-select", "x-request-id", "content-length"}
)
#: The only headers of a node's answer the router passes on (ROUTER §8.6): the ones our
#: server sends that mean something to a client. A node is a process that holds the node
#: token, not a party the router's clients trust: anything else it adds (``Set-Cookie``,
#: ``Access-Control-Allow-Origin: *``, ``Location``, ...) would speak in the router's name
#: to the client and to a browser, so it is dropped. Extending this list is a deliberate
#: act; ``tests/security/test_router_attack_node_headers.py`` checks it against every header
#: our server sends.
RELAYED_RESPONSE_HEADERS = frozenset(
    {
        "content-type",
        "allow",  # 405 (PROTOCOL §2)
        "retry-after",  # 503 busy
        "cache-control",  # job events (Server-Sent Events)
        "x-accel-buffering",  # job events: proxies must not buffer the stream
    }
)
#: Headers our server sends that the router does not relay on purpose: it frames the body
#: itself (``content-length``, hop-by-hop), names itself (``server``, ``date``) and sets its
#: own ``x-request-id`` and ``x-kcoral-node``; a job list is the router's own merge, which
#: reads each node's ``x-kcoral-jobs-left-out`` and says its own sum (ROUTER §13). The
#: browser headers (``browser_guard.BROWSER_HEADERS``) are the router's own on every answer.
DROPPED_RESPONSE_HEADERS = HOP_BY_HOP | {
    "content-length",
    "server",
    "date",
    "x-content-type-options",
    "x-frame-options",
    "content-security-policy",
    "x-request-id",
    "x-kcoral-node",
    "x-kcoral-jobs-left-out",
}
METHOD_HEADER, PATH_HEADER = b":method", b":path"
#: Statuses whose answer has no body (RFC 9110 §15.3.5, §15.4.5), which our server never
#: sends through a tunnel. Tornado frames nothing after such a head (no chunking, no
#: length), so whatever ``data`` a node sent after one would reach the client's keep-alive
#: connection as raw bytes: a forged next answer, with any headers (response splitting).
#: A head with one is an invalid response (ROUTER §8.6); 1xx are refused likewise.
BODILESS_STATUSES = frozenset({204, 304})


def identity_header(identity: Identity) -> pb.HttpHeader:
    """``x-kcoral-identity`` naming who the router authenticated (``default`` when open)."""
    return pb.HttpHeader(
        name=IDENTITY_HEADER.lower().encode(), value=identity.header_value().encode()
    )


def connection_named(headers: tornado.httputil.HTTPHeaders) -> set[str]:
    """The header names a ``Connection`` header lists (hop-by-hop for this hop only)."""
    names: set[str] = set()
    for value in headers.get_list("Connection"):
        names.update(part.strip().lower() for part in value.split(",") if part.strip())
    return names


def forwarded_headers(
    request: tornado.httputil.HTTPServerRequest,
    identity: Identity,
    request_id: str,
    declared: int | None,
) -> list[pb.HttpHeader]:
    """The headers of ``request``'s head towards the node: ``declared`` is its body length
    (None: chunked)."""
    dropped = NOT_FORWARDED | connection_named(request.headers)
    headers = []
    method = request.method or ""
    if request.path != "/execute" or method != "POST":
        headers.append(pb.HttpHeader(name=METHOD_HEADER, value=method.encode()))
        headers.append(pb.HttpHeader(name=PATH_HEADER, value=(request.uri or "").encode()))
    # Lowercase names, as HTTP/2 requires (RFC 9113 §8.2.1, ROUTER §8.4): a node may read
    # them as an ASGI server does and would not see `Content-Type` at all.
    headers.extend(
        pb.HttpHeader(name=name.lower().encode("latin-1"), value=value.encode("latin-1"))
        for name, value in request.headers.get_all()
        if name.lower() not in dropped
    )
    headers.append(identity_header(identity))
    headers.append(pb.HttpHeader(name=b"x-request-id", value=request_id.encode()))
    if declared is not None:
        headers.append(pb.HttpHeader(name=b"content-length", value=str(declared).encode()))
    return headers


def relayed_response_head(frame: pb.SlotFrame) -> tuple[int | None, list[tuple[str, str]]]:
    """A node's response head: its status and the headers the router relays, or
    ``(None, [])`` for a frame that is no valid head."""
    if frame.WhichOneof("payload") != "response_head":
        return None, []
    status = frame.response_head.status
    if not 200 <= status <= 599 or status in BODILESS_STATUSES:
        return None, []
    headers = []
    try:
        for header in frame.response_head.headers:
            name = header.name.decode("ascii")
            value = header.value.decode("latin-1")
            if not name or any(c in name for c in " :\r\n\0") or any(c in value for c in "\r\n\0"):
                return None, []
            if name.lower() in RELAYED_RESPONSE_HEADERS:
                headers.append((name, value))
    except UnicodeDecodeError:
        return None, []
    return status, headers
