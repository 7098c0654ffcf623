"""One exception vocabulary for the client, the protocol layer and uploaded code.

Client-side exceptions follow CLIENT_API.md §9; ``ValidationError`` is what the protocol layer
raises for invalid programs and paths; ``ExecutionError`` lets uploaded code and the server's
helpers fail an instruction with a chosen kind (PROTOCOL.md §7.6).
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Defined by the protocol layer (which imports nothing else of kcoral), re-exported here.
from kcoral.protocol.errors import INSTRUCTION_ERROR_KINDS, ExecutionError, ValidationError
from kcoral.protocol.output_order import Run, interleave
from kcoral.run.terminal_filter import screened

if TYPE_CHECKING:
    from kcoral.results import ProgramResult

__all__ = [
    "INSTRUCTION_ERROR_KINDS",
    "ExecutionError",
    "KCoralError",
    "PrintedOutput",
    "ProtocolError",
    "RemoteExecutionError",
    "TransportError",
    "ValidationError",
]


@dataclass(frozen=True)
class PrintedOutput:
    """What a program printed before its deadline cut it, as its 504 carries it
    (EXTENSIONS §15): each stream bounded, ``*_truncated`` when the server or the client cut
    it. The server's text as it came: screen it before a terminal shows it."""

    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    #: how the two interleaved, where the 504 said (EXTENSIONS §16); ``()`` otherwise
    output_order: tuple[Run, ...] = ()

    def output_in_order(self) -> list[tuple[str, str]]:
        """``("stdout" or "stderr", text)`` pieces in the order the program wrote them, as
        ``ProgramResult.output_in_order`` gives a finished program's."""
        return interleave(self.stdout, self.stderr, self.output_order)


class KCoralError(Exception):
    """A non-200 HTTP answer from a KCoral server or router. ``output``: what the program
    printed before its deadline, where a 504 carried it (``None`` otherwise)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        kind: str | None = None,
        request_id: str | None = None,
        output: PrintedOutput | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status_code, message)
        self.status_code = status_code
        self.message = message
        self.kind = kind
        self.request_id = request_id
        self.output = output
        #: the answer's ``Retry-After`` in seconds (delta-seconds only), None without one
        self.retry_after = retry_after
        #: what to do, said before the server's text (a 401's: where a token comes from;
        #: set by the client that made the request, which knows the URL and the token)
        self.hint = ""
        #: a redirect's (3xx) target as ``redirect_hint`` shows it (scheme, host, port; None
        #: for another answer), which a notebook's own lines name
        self.redirect_to: str | None = None

    def __str__(self) -> str:
        # Who can reach this: the server answering, malicious or not, writes ``message``;
        # Python prints this ``str`` of an uncaught error to the user's terminal as it is,
        # where an escape string writes the clipboard or types into the shell. ``message``
        # keeps the server's text whole for a program that reads it.
        if self.hint:
            return f"{self.hint} [the server said: {screened(self.message)}]"
        return f"HTTP {self.status_code}: {screened(self.message)}"

    @property
    def without_error_body(self) -> bool:
        """Whether the answer carried no KCoral ``ERROR`` body (its message is then only
        ``HTTP <code>``, CLIENT_API §9): something other than a KCoral server answered,
        another program on that port or a proxy in front of one."""
        return self.kind is None and self.message == f"HTTP {self.status_code}"


class TransportError(Exception):
    """No HTTP response arrived. The server may already have run the program.

    ``url`` is the address that did not answer (``None`` when unknown): the notebook names
    it in its one-line message instead of the transport library's chain of causes."""

    def __init__(
        self, message: str, *, url: str | None = None, answered_but: str | None = None
    ) -> None:
        super().__init__(message)
        self.url = url
        #: where the server did answer: what went wrong then, in a few words (``its answer
        #: was refused: more than 100 headers``, ``its answer did not end within 30 s``), so
        #: a caller says "answered, but ..." in its own line; None where no answer came
        self.answered_but = answered_but


#: what TLS says when the other end answers in plain HTTP, or hangs up on the handshake
_PLAIN_HTTP_SIGNS = ("WRONG_VERSION_NUMBER", "EOF occurred in violation of protocol")
#: said after such a failure: an ``https://`` address at a KCoral server gave only the TLS
#: library's words ("[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)")
PLAIN_HTTP_HINT = (
    "the server may speak plain HTTP (KCoral servers do, unless a proxy in front adds TLS): "
    "try its http:// address"
)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it wraps, outermost first: urllib3 wraps the socket error two or
    three times (``MaxRetryError.reason``, ``NewConnectionError.__cause__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        reason = getattr(current, "reason", None)
        current = (
            reason
            if isinstance(reason, BaseException)
            else (current.__cause__ or current.__context__)
        )


def plain_http_hint(exc: BaseException) -> str:
    """``PLAIN_HTTP_HINT`` when ``exc`` (or what it wraps) is TLS failing as against plain
    HTTP, else ``""``."""
    for cause in _causes(exc):
        if type(cause).__name__.startswith("SSL") and any(
            sign in str(cause) for sign in _PLAIN_HTTP_SIGNS
        ):
            return PLAIN_HTTP_HINT
    return ""


#: urllib3's timeouts say their bound at the end of their text: ``(read timeout=1.5)``
_TIMEOUT_BOUND = re.compile(r"\((read|connect) timeout=([0-9.]+)\)")
#: the transport's own words for a body cut short (``kcoral.connection.http``)
_CUT_BODY = re.compile(r"connection closed after (\d+) of (\d+) body bytes")
#: said after "connection refused" where the whole line stands alone (``TransportError``)
NOTHING_LISTENS_HINT = "is a KCoral server running there?"


def _reason_words(cause: BaseException) -> str | None:
    """The few true words for one link of a transport failure's chain, where it is one we
    know; None otherwise. urllib3's own texts name its objects and repeat the address
    (``HTTPConnection(host='127.0.0.1', port=8000): Failed to establish a new connection:
    [Errno 111] Connection refused``); the innermost socket error alone (``timed out``) lost
    which bound ran out and after how many seconds."""
    text = str(cause)
    bound = _TIMEOUT_BOUND.search(text)
    if bound:
        kind, seconds = bound.groups()
        what = "no answer" if kind == "read" else "no connection"
        return f"{what} within {seconds} s ({kind} timeout)"
    cut = _CUT_BODY.search(text)
    if cut:
        return _cut_short(int(cut[1]), int(cut[2]))
    if isinstance(cause, http.client.IncompleteRead):
        # urllib3's IncompleteRead counts bytes read as an int, http.client's keeps them
        read = cause.partial if isinstance(cause.partial, int) else len(cause.partial)
        more = cause.expected if isinstance(cause.expected, int) else None
        return _cut_short(read, None if more is None else read + more)
    if isinstance(cause, http.client.BadStatusLine) and not isinstance(
        cause, http.client.RemoteDisconnected
    ):
        line = str(cause)  # the other end's bytes: shown as Python writes them, escaped
        return f"the answer is not HTTP (it began {line[:60]!r})"
    if isinstance(cause, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, ConnectionResetError):
        return "the connection was reset"
    if isinstance(cause, socket.gaierror):
        return f"the host name does not resolve ({cause.strerror or 'no address'})"
    if isinstance(cause, ssl.SSLError) and cause.reason:
        return f"TLS failed ({cause.reason})"
    return None


#: how ``root_reason`` begins for an answer cut short (its head came: the server was reached)
CUT_SHORT_WORDS = "the connection closed in the middle of the answer"


def _cut_short(read: int, expected: int | None) -> str:
    of = "" if expected is None else f" of {expected}"
    return f"{CUT_SHORT_WORDS} ({read}{of} bytes came)"


def root_reason(exc: BaseException) -> str:
    """A transport failure in a few true words (``connection refused``, ``no answer within
    30 s (read timeout)``): what a person can act on (the notebook's errors and ``kcoral run``
    both say it in one line, and so does ``TransportError``)."""
    causes = list(_causes(exc))
    hint = plain_http_hint(exc)
    words = next((w for w in map(_reason_words, causes) if w is not None), None)
    if words is None:
        last = causes[-1]
        text = (last.strerror if isinstance(last, OSError) else None) or str(last).strip()
        text = text or type(last).__name__
        # the other end may write these words (a malicious server): no control character of
        # theirs reaches the terminal the line is printed on
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
        # urllib3's texts name objects by address ("<... object at 0x7f...>: ..."): keep the
        # tail.
        text = text.rpartition(">: ")[2] or text
        words = text if len(text) <= 160 else text[:157] + "..."
    return f"{words}; {hint}" if hint else words


def refused_answer(exc: BaseException) -> str | None:
    """Why this client refused an answer that came (a head it will not parse), in a few
    words; None where none came or it was not refused. The HTTP library says ``got more
    than 100 headers`` as it says ``connection refused``: both read as unreachable."""
    for cause in _causes(exc):
        text = str(cause)
        if isinstance(cause, http.client.LineTooLong):  # "got more than 65536 bytes when
            what = text.rpartition("reading ")[2] or "line"  # reading header line"
            return f"a {what} over 64 KiB" if what.isprintable() else "a line over 64 KiB"
        if type(cause) is http.client.HTTPException and text.startswith("got more than"):
            return text.removeprefix("got ")  # "more than 100 headers"
        if type(cause).__name__ == "InvalidHeader" and "Content-Length" in text:
            return "conflicting Content-Length values"
        if isinstance(cause, http.client.BadStatusLine) and not isinstance(
            cause, http.client.RemoteDisconnected
        ):
            return _reason_words(cause)
    return None


def head_began(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) ended an answer's head after some of it came: a
    status line cut short (the HTTP library calls it bad, the connection having ended it),
    not a connection that ended before any byte (``RemoteDisconnected``)."""
    return any(
        isinstance(cause, http.client.BadStatusLine)
        and not isinstance(cause, http.client.RemoteDisconnected)
        for cause in _causes(exc)
    )


def unreachable_message(url: str, exc: BaseException) -> str:
    """``TransportError``'s one line for ``exc`` at ``url`` (``transport_error``)."""
    return str(transport_error(url, exc))


def transport_error(url: str, exc: BaseException) -> TransportError:
    """The ``TransportError`` for ``exc`` at ``url``: ``cannot reach http://127.0.0.1:8000:
    connection refused (is a KCoral server running there?)``; where the server was reached
    and its answer refused or cut short, ``http://127.0.0.1:8000 answered, but its answer
    was refused: more than 100 headers`` (or ``answered, but the connection closed in the
    middle of the answer (6 of 100 bytes came)``), its ``answered_but`` the words after
    ``but``."""
    refused = refused_answer(exc)
    if refused is not None:
        return answered_but(url, f"its answer was refused: {refused}")
    reason = root_reason(exc)
    if reason.startswith(CUT_SHORT_WORDS):
        return answered_but(url, reason)
    if reason == "connection refused":
        reason = f"{reason} ({NOTHING_LISTENS_HINT})"
    return TransportError(f"cannot reach {url}: {reason}", url=url)


def answered_but(url: str, trouble: str) -> TransportError:
    """``URL answered, but <trouble>``: the server was reached, its answer was not taken."""
    return TransportError(answered_but_line(url, trouble), url=url, answered_but=trouble)


def answered_but_line(where: str, trouble: str) -> str:
    """``WHERE answered, but <trouble>``: how a server that was reached, but whose answer was
    not taken, is said, by ``TransportError`` and by every notebook line that names it
    (``it``, ``URL, where session s1 runs``); one phrasing, so they stay alike."""
    return f"{where} answered, but {trouble}"


class AnswerTooLarge(TransportError):
    """An answer over what this client reads (``max_answer_bytes``, EXTENSIONS §17): the
    server was reached, so it is a ``TransportError`` with ``answered_but``; a subclass so
    a caller tells a large, perhaps honest, answer from one that is not KCoral's."""


class ProtocolError(Exception):
    """A response broke the protocol, or cache negotiation could not recover."""


class RemoteExecutionError(RuntimeError):
    """A remote function's program ended ``FAILED``; ``result`` holds the whole outcome."""

    def __init__(self, result: ProgramResult) -> None:
        error: dict[str, Any] = result.error or {}
        # The server writes the failure's message (a malicious one, anything): screened for
        # the terminal an uncaught error is printed on, as its note is (remote_report);
        # ``result.error`` keeps it whole.
        super().__init__(
            screened(
                f"Remote execution {result.request_id} failed: "
                f"{error.get('kind')}: {error.get('message')}"
            )
        )
        self.result = result

    def __reduce__(
        self,
    ) -> tuple[type[RemoteExecutionError], tuple[ProgramResult], dict[str, Any]]:
        # Pickled with its result, not its message: a multiprocessing worker's remote call
        # that failed reaches the parent as this error. Rebuilt from the message, it raised
        # AttributeError in the pool's result thread, and pool.map waited for ever.
        return (type(self), (self.result,), self.__dict__)

    @property
    def remote_traceback(self) -> str:
        """The server-side traceback of the failure ("" when the server sent none)."""
        traceback: str = (self.result.error or {}).get("traceback", "")
        return traceback
