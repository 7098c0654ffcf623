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

Where the limit is unknown the body goes as before: a server without ``/v1/info``
(PROTOCOL alone), an answer that is not a JSON object, a limit that is not a positive
integer (what a broken or hostile server says blocks nothing), and a router, whose
``/v1/info`` is one node's (ROUTER §6): that node's limit is neither the router's own nor
another node's.
"""

from __future__ import annotations

from kcoral.connection.transport import Flow, Request, Response
from kcoral.errors import KCoralError
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.strict_json import loads_strict
from kcoral.run.progress import format_bytes

#: Bodies from this size on are checked against the server's stated limit (one ``GET`` each;
#: a smaller body costs little more to send than the question would).
ASK_FROM_BYTES = 8 << 20


class RequestTooLarge(KCoralError):
    """The body is larger than the limit the server states: nothing was sent. A
    ``KCoralError`` 413 ``request_too_large``, as the server's own refusal would be."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(
            413,
            f"request not sent: its body of {format_bytes(length)} ({length} bytes) is over "
            f"the server's limit of {format_bytes(limit)} ({limit} bytes; kcoral server "
            "--max-request-bytes)",
            kind="request_too_large",
        )
        self.length = length
        self.limit = limit

    def __str__(self) -> str:
        return self.message  # our own words, not an answer's: no "HTTP 413" before them


def stated_limit(info: Response) -> int | None:
    """``limits.max_request_bytes`` of a server's ``/v1/info`` answer; None where it states
    none we can hold it to (see the module's docstring)."""
    if info.status != 200:
        return None
    try:
        document = loads_strict(info.data)
    except (ValidationError, RecursionError):
        return None
    if not isinstance(document, dict) or "fleet" in document:
        return None
    limits = document.get("limits")
    limit = limits.get("max_request_bytes") if isinstance(limits, dict) else None
    if type(limit) is not int or limit < 1:  # not a bool, a float, a text
        return None
    return limit


class KnownLimit:
    """The limit a client's server states, asked before the first body of
    ``ASK_FROM_BYTES`` or more and kept (see the module's docstring)."""

    def __init__(self) -> None:
        self._asked = False
        self._limit: int | None = None

    def check(self, length: int, ask: Request) -> Flow[None]:
        """``RequestTooLarge`` when a body of ``length`` bytes is over the server's stated
        limit, asking it with ``ask`` (``GET /v1/info``) when none is kept or the kept one
        would refuse the body."""
        if length < ASK_FROM_BYTES:
            return
        fresh = not self._asked
        if fresh or (self._limit is not None and length > self._limit):
            self._limit = stated_limit((yield ask))
            self._asked = True
        if self._limit is not None and length > self._limit:
            raise RequestTooLarge(length, self._limit)

    def answered(self, status: int) -> None:
        """A body's answer came: a 413 means the kept limit is no longer the server's."""
        if status == 413:
            self._asked = False
