"""The label values metrics may carry: each from a fixed set, so a series count stays bounded
whatever clients send (EXTENSIONS §13).

No label ever holds a token, an identity, a request id or anything of a program: the values
below are the server's own words (error kinds, finish and retirement reasons, endpoints),
HTTP status classes, and GPU ids from the server's configuration. Anything outside a set is
counted as ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kcoral.protocol.errors import INSTRUCTION_ERROR_KINDS
from kcoral.protocol.selector import INVALID_SELECTOR, NO_MATCHING_NODE, SELECTOR_MISMATCH

OTHER = "other"
NONE = "none"

#: error kinds of answers (PROTOCOL §7.6, §10; EXTENSIONS) besides the instruction kinds
ERROR_KINDS = INSTRUCTION_ERROR_KINDS | {
    "timeout",
    "busy",
    "cancelled",
    "request_too_large",
    "body_timeout",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "not_finished",
    "session_busy",
    "session_ended",
    "too_many_streams",
    INVALID_SELECTOR,
    NO_MATCHING_NODE,
    SELECTOR_MISMATCH,
}
#: ``request_finished``'s ``finish_reason`` (SERVER §13)
FINISH_REASONS = frozenset(
    {
        "completed",
        "program_failed",
        "cache_miss",
        "rejected",
        "no_worker",
        "timeout",
        "crashed",
        "server_error",
        "client_disconnected",
        "cancelled",
    }
)
#: ``worker_retired``'s ``reason`` (SERVER §13)
RETIRE_REASONS = frozenset(
    {
        "request_limit",
        "poisoned_context",
        "sandbox_cleanup",
        "timeout",
        "crashed",
        "cancelled",
        "identity",
        "disk_limit",
        "preload",
    }
)
#: ``worker_failed``'s ``phase``
START_PHASES = frozenset({"startup", "respawn"})


def one_of(value: Any, allowed: Iterable[str]) -> str:
    """``value`` when it is one of ``allowed``, ``none`` when absent, else ``other``."""
    if value is None:
        return NONE
    return value if isinstance(value, str) and value in allowed else OTHER


def status_label(value: Any) -> str:
    """An HTTP status as its three digits (100-599), else ``other``."""
    return str(value) if isinstance(value, int) and 100 <= value <= 599 else OTHER


def gpu_label(value: Any, gpu_ids: frozenset[int]) -> str:
    """A configured GPU's id, ``cpu`` for none, else ``other`` (never a client's number)."""
    if value is None:
        return "cpu"
    return str(value) if isinstance(value, int) and value in gpu_ids else OTHER


#: the most digits of a GPU id a router relays from a node's text (a server's GPU ids are its
#: configured ones, physical device numbers)
MAX_GPU_ID_DIGITS = 3


def word_of(value: str, allowed: frozenset[str]) -> str:
    """A label value a node's text holds, as its server could have written it: one of
    ``allowed``, ``none`` or ``other``; anything else is ``other``."""
    return value if value in allowed or value in (NONE, OTHER) else OTHER


#: the HTTP statuses a server answers: its own (PROTOCOL §7, EXTENSIONS, ROUTER; 499 is
#: logged only) and Tornado's refusals of malformed HTTP
SERVER_STATUSES = frozenset(
    str(status)
    for status in (
        *(200, 201, 202, 204, 304),
        *(400, 401, 403, 404, 405, 408, 409, 410, 411, 413, 414, 415, 417, 429, 431, 499),
        *(500, 501, 502, 503, 504, 505),
    )
)


def status_word(value: str) -> str:
    """A relayed ``status``: one a server answers (``SERVER_STATUSES``) or ``other``. Any
    three digits of 100-599 let a rogue node cycle 500 statuses against every reason and
    error kind: some 156,000 series a node id in Prometheus, 2048 new ones each 5 s."""
    return value if value == OTHER or value in SERVER_STATUSES else OTHER


def gpu_word(value: str) -> str:
    """A relayed ``gpu``: a GPU id as a server writes it (``gpu_label``), ``cpu``, ``none`` or
    ``other``; any other value is ``other``."""
    if value in ("cpu", NONE, OTHER):
        return value
    digits = value.isascii() and value.isdigit() and len(value) <= MAX_GPU_ID_DIGITS
    return value if digits and str(int(value)) == value else OTHER


#: the router's ``request_finished`` ``finish_reason`` (ROUTER §10)
ROUTER_FINISH_REASONS = frozenset(
    {
        "completed",
        "queue_full",
        "queue_timeout",
        "tunnel_disconnected",
        "invalid_response",
        "request_rejected",
        "client_disconnected",
        "shutting_down",
        "node_gone",
    }
)
#: finish reasons that say the tunnel to a node failed
TUNNEL_ERRORS = frozenset({"tunnel_disconnected", "invalid_response"})
#: node states (ROUTER §6)
NODE_STATES = frozenset(
    {"starting", "ready", "recovering", "incompatible", "unhealthy", "draining", "left"}
)
#: the most node ids a router's metrics name at once; later ones are counted as ``other``
#: (anyone holding the node token may connect under new ids) until a named node's record is
#: forgotten (ROUTER §6's retention), which frees its name
MAX_NAMED_NODES = 256
#: the most node kinds a router's metrics name (a kind is a node's word too)
MAX_NAMED_KINDS = 64


def endpoint_of(path: Any) -> str:
    """A request path as the endpoint it names (never the path: it holds job and session ids).
    Only jobs and sessions have paths below their own: ``/health/x`` is no health check, and
    counted as one it put a stranger's 404s into the health endpoint's durations."""
    if not isinstance(path, str) or path == "/execute":
        return "execute"
    for prefix, endpoint in (("/v1/jobs", "jobs"), ("/v1/sessions", "sessions")):
        if path == prefix or path.startswith(prefix + "/"):
            return endpoint
    return {"/v1/info": "info", "/health": "health", "/metrics": "metrics"}.get(path, OTHER)


class BoundedLabels:
    """Words the router learns from nodes (node ids, kinds) as label values: at most
    ``limit`` distinct ones named at once, later ones as ``other``; ``none`` for an empty
    one. A word is named until ``release``d (the router forgot the node)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, word: Any) -> str:
        if not isinstance(word, str) or not word:
            return NONE
        if word in self._seen:
            return word
        if len(self._seen) >= self._limit:
            return OTHER
        self._seen.add(word)
        return word

    @property
    def named(self) -> frozenset[str]:
        return frozenset(self._seen)

    def release(self, word: str) -> None:
        """Stop naming ``word``: its place goes to the next new word."""
        self._seen.discard(word)
