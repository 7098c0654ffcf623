"""A request body over the server's ``--max-request-bytes`` is refused before it is sent
(CLIENT_API §2.1 step 11).

urllib3 reads an answer only once the whole body is out, so a 1 GiB body went out in full
(1.6 s on loopback, minutes over a real network) only to be answered 413. A body of
``ASK_FROM_BYTES`` or more is held to ``GET /v1/info``'s ``limits.max_request_bytes``
(EXTENSIONS §1), asked once per client (``KnownLimit``): asked afresh for each such body,
it cost a round trip per attempt (a 9 MiB program's execute on loopback 34.2 ms asked,
31.8 kept: ``benchmarks/upload_client_cpu.py``). Plain HTTP asks too, though its early stop
(``kcoral.connection.early_answer``) refuses as fast on loopback (8.8 ms against 8.4 per
refusal of 64 MiB over 16): the stop has sent megabytes first, slow over a real link, and
the server's 413 does not say the body went unsent. A kept limit never refuses a body
alone: a server restarted with a larger one is asked again before a body over the kept one
is refused, and a 413 answer (a server restarted with a smaller one) forgets it.

A router's ``/v1/info`` is one node's (ROUTER §6), so its ``limits`` are neither the
router's own nor another node's: a router is held to its ``fleet_limits.max_request_bytes``
(ROUTER §13), the largest body it passes on that some ready node may take, and to nothing
where it states none (a router from before it).

Where the limit is unknown the body goes as before: a server without ``/v1/info``
(PROTOCOL alone), an answer that is not a JSON object, a limit that is not a positive
integer (what a broken or hostile server or router says blocks nothing).
"""

from __future__ import annotations

from typing import NamedTuple

from kcoral.connection.transport import Flow, Request, Response
from kcoral.errors import KCoralError
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.strict_json import loads_strict
from kcoral.run.progress import format_bytes

#: Bodies from this size on are checked against the server's stated limit (one ``GET`` each;
#: a smaller body costs little more to send than the question would).
ASK_FROM_BYTES = 8 << 20

#: whose limit a refusal names, and the setting that makes it, by who set it
_WHOSE = {
    "server": ("the server's limit of", "kcoral server --max-request-bytes"),
    "router": ("the router's limit of", "kcoral router --max-request-bytes"),
    "nodes": (
        "the largest limit of the router's ready nodes,",
        "kcoral server --max-request-bytes on the nodes",
    ),
}


class StatedLimit(NamedTuple):
    """A limit ``/v1/info`` states: its bytes, and whose it is (a key of ``_WHOSE``)."""

    bytes: int
    whose: str


class RequestTooLarge(KCoralError):
    """The body is larger than the limit the server states: nothing was sent. A
    ``KCoralError`` 413 ``request_too_large``, as the server's own refusal would be."""

    def __init__(self, length: int, limit: int, whose: str = "server") -> None:
        limit_of, setting = _WHOSE[whose]
        super().__init__(
            413,
            f"request not sent: its body of {format_bytes(length)} ({length} bytes) is over "
            f"{limit_of} {format_bytes(limit)} ({limit} bytes; {setting})",
            kind="request_too_large",
        )
        self.length = length
        self.limit = limit
        self.over = f"{limit_of} {format_bytes(limit)} ({limit} bytes; {setting})"

    def __str__(self) -> str:
        return self.message  # our own words, not an answer's: no "HTTP 413" before them


def stated_limit(info: Response) -> StatedLimit | None:
    """``limits.max_request_bytes`` of a server's ``/v1/info`` answer, a router's
    ``fleet_limits.max_request_bytes``; None where it states none we can hold it to (see the
    module's docstring)."""
    if info.status != 200:
        return None
    try:
        document = loads_strict(info.data)
    except (ValidationError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    whose = "server"
    limits = document.get("limits")
    if "fleet" in document:  # a router's
        limits = document.get("fleet_limits")
        whose = (
            "router" if isinstance(limits, dict) and limits.get("set_by") == "router" else "nodes"
        )
    limit = limits.get("max_request_bytes") if isinstance(limits, dict) else None
    if type(limit) is not int or limit < 1:  # not a bool, a float, a text
        return None
    return StatedLimit(limit, whose)


class KnownLimit:
    """The limit a client's server states, asked before the first body of
    ``ASK_FROM_BYTES`` or more and kept (see the module's docstring)."""

    def __init__(self) -> None:
        self._asked = False
        self._limit: StatedLimit | None = None

    def check(self, length: int, ask: Request) -> Flow[None]:
        """``RequestTooLarge`` when a body of ``length`` bytes is over the server's stated
        limit, asking it with ``ask`` (``GET /v1/info``) when none is kept or the kept one
        would refuse the body."""
        if length < ASK_FROM_BYTES:
            return
        fresh = not self._asked
        if fresh or (self._limit is not None and length > self._limit.bytes):
            self._limit = stated_limit((yield ask))
            self._asked = True
        if self._limit is not None and length > self._limit.bytes:
            raise RequestTooLarge(length, *self._limit)

    def answered(self, status: int) -> None:
        """A body's answer came: a 413 means the kept limit is no longer the server's."""
        if status == 413:
            self._asked = False
