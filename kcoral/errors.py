"""One exception vocabulary for the client, the protocol layer and uploaded code.

Client-side exceptions follow CLIENT_API.md §9; ``ValidationError`` is what the protocol layer
raises for invalid programs and paths; ``ExecutionError`` lets uploaded code and the server's
helpers fail an instruction with a chosen kind (PROTOCOL.md §7.6).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Defined by the protocol layer (which imports nothing else of kcoral), re-exported here.
from kcoral.protocol.errors import INSTRUCTION_ERROR_KINDS, ExecutionError, ValidationError
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
    ) -> None:
        super().__init__(status_code, message)
        self.status_code = status_code
        self.message = message
        self.kind = kind
        self.request_id = request_id
        self.output = output

    def __str__(self) -> str:
        # Who can reach this: the server answering, malicious or not, writes ``message``;
        # Python prints this ``str`` of an uncaught error to the user's terminal as it is,
        # where an escape string writes the clipboard or types into the shell. ``message``
        # keeps the server's text whole for a program that reads it.
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

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


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


def root_reason(exc: BaseException) -> str:
    """The innermost cause of a transport failure in a few words (``Connection refused``):
    what a person can act on (the notebook's errors and ``kcoral run`` both say it in one
    line)."""
    *_, last = _causes(exc)
    hint = plain_http_hint(exc)
    if isinstance(last, OSError) and last.strerror and not hint:
        return last.strerror
    text = (last.strerror if isinstance(last, OSError) else None) or str(last).strip()
    text = text or type(last).__name__
    # urllib3's texts name objects by address ("<... object at 0x7f...>: ..."): keep the tail.
    text = text.rpartition(">: ")[2] or text
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{text}; {hint}" if hint else text


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
