"""A request body stops being sent once the server has answered (CLIENT_API §2.1 step 12).

urllib3 reads an answer only once the whole body is out, while a server refuses a body it
will not read at once, from its headers: a 413 over ``--max-request-bytes`` where no limit
was known beforehand (a router, a PROTOCOL.md server), a 401 for a missing or refused token,
a 403. Our servers then keep reading and dropping the body until the client stops (lingering
close), so the client sent all of it, gigabytes for nothing, before it saw the answer.

``stopped_once_answered`` hands the body on in the pieces ``body_pieces`` cuts (at most
``PIECE_BYTES``, 1 MiB) and, before each, asks (``poll``, no wait) whether the connection
it goes out on has something to read; if so it ends the body there: urllib3 then reads
the answer that is waiting, and the transport closes that connection, whose request was
cut short, instead of pooling it. A server that answers ahead of the body is either
refusing it or closing; no KCoral answer comes while a body it reads is still arriving.
Only plain HTTP: over TLS the socket can be readable with no answer (a TLS 1.3 session
ticket), which would cut every body short.
"""

from __future__ import annotations

import select
import ssl
from collections.abc import Iterable, Iterator

from kcoral.connection.request_connection import current


class EarlyAnswer:
    """Whether a request's body was cut short because its answer came first."""

    def __init__(self) -> None:
        self.came = False


def stopped_once_answered(
    pieces: Iterable[bytes | memoryview], answer: EarlyAnswer
) -> Iterator[bytes | memoryview]:
    """``pieces`` (``body_pieces``', at most ``PIECE_BYTES`` each), ending as soon as the
    connection this thread took has an answer to read (``answer.came`` then tells)."""
    source = iter(pieces)
    try:
        for piece in source:
            if _answered():
                answer.came = True
                return
            yield piece
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()  # a local file being sent is closed now, not when collected


def _answered() -> bool:
    record = current()
    sock = getattr(record and record.connection, "sock", None)
    if sock is None or isinstance(sock, ssl.SSLSocket):
        return False
    try:
        if not hasattr(select, "poll"):  # Windows
            return bool(select.select([sock], [], [], 0)[0])
        poller = select.poll()  # select() cannot watch a descriptor past 1023
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed meanwhile: the send itself will say so
        return False
