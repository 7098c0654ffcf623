"""Errors a notebook user sees: one line of cause, one line of what to do.

A dead URL used to print ten thousand characters of urllib3 traceback and an interrupt a
traceback through the magic's own frames; neither helps the person at the notebook. Every
request-level failure (no answer, an HTTP error, a deadline, a cancel, a refused format)
becomes one of the classes below, whose ``_render_traceback_`` (the hook IPython calls instead
of formatting a traceback) returns exactly two lines. ``%config KCoral.verbose_errors = True``
shows the whole chain, internal frames included. A failing program's own traceback is not
handled here (``runner.RemoteCellError`` shows it as it is).

No IPython import: the classes are plain exceptions that also read well outside a kernel.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from kcoral import KCoralError, TransportError
from kcoral.base_client import token_refusal
from kcoral.connection.server_address import path_not_served_hint
from kcoral.errors import AnswerTooLarge, answered_but_line, root_reason
from kcoral.local_folder import SentFileChanged
from kcoral.run.terminal_filter import screened

#: Said after the action when the short form hides frames.
VERBOSE_HINT = "%config KCoral.verbose_errors = True shows the whole traceback"


class TwoLineError(BaseException):
    """Base of the short errors: ``cause`` (what happened) and ``action`` (what to do). Each
    subclass also derives from the built-in exception it is a kind of (``TimeoutError``,
    ``KeyboardInterrupt``, ...), so ``except`` clauses written for those still catch it.

    ``verbose`` is set by the magic from ``KCoral.verbose_errors`` just before the error
    leaves the cell; the short form is the default."""

    verbose = False

    def __init__(self, cause: str, action: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.action = action

    def __str__(self) -> str:
        return screened(f"{self.cause}\n{self.action}")

    def _render_traceback_(self) -> list[str]:
        # A cause may hold a server's message (a refusal's), which IPython on a terminal
        # prints as it is: screened (kcoral.run.terminal_filter), colours kept.
        if self.verbose:
            text = "".join(traceback.format_exception(self))
            return screened(text.rstrip("\n")).splitlines()
        return screened(f"{type(self).__name__}: {self.cause}\n{self.action}").split("\n")


class ServerUnreachableError(TwoLineError, ConnectionError):
    """No HTTP answer came (refused, reset, unknown host, connect time-out)."""


class FolderChangedError(TwoLineError, ValueError):
    """A file of a ``--folder`` changed between its hashing and its send; nothing ran."""


class ServerRefusedError(TwoLineError, RuntimeError):
    """The server answered with an HTTP error (busy, unauthorized, too large, ...)."""

    def __init__(self, cause: str, action: str, *, status_code: int, kind: str | None) -> None:
        super().__init__(cause, action)
        self.status_code = status_code
        self.kind = kind


class CellTimeoutError(TwoLineError, TimeoutError):
    """The server's execution deadline fired; says which limit and how to change it."""


class CellCancelledError(TwoLineError, KeyboardInterrupt):
    """The cell was interrupted or its job cancelled (still a ``KeyboardInterrupt``)."""


class PickleRefusedError(TwoLineError, RuntimeError):
    """An ``--in`` value needed pickle and the server does not allow it."""


class NotConnectedError(TwoLineError, ConnectionError):
    """``%kcoral connect`` failed: the kernel stays unconnected until told otherwise."""


class ServerAddressError(TwoLineError, ValueError):
    """A server address (``--url``, ``%kcoral connect``, ``KCoral.url``) that the address
    rule of ``kcoral.connection.server_address`` does not allow."""


class TokenSettingError(TwoLineError, ValueError):
    """``KCoral.token`` (``KCORAL_TOKEN`` unless set by ``%config``) that no request can carry;
    the cause never shows it."""


class EmbeddedServerUnavailableError(TwoLineError, RuntimeError):
    """No server is configured and this platform cannot run the embedded one."""


class LocalServerStartError(TwoLineError, RuntimeError):
    """The embedded server did not start (its arguments, its start timeout, or it exited);
    the cause names the arguments and its log file, which stays until the next start."""


class LocalServerGoneError(TwoLineError, LookupError):
    """A job asked for on this kernel's embedded server, which is not running (stopped, or
    exited): its jobs ended with it, and a new one would have none."""


class GpuRequiredError(TwoLineError, RuntimeError):
    """``require_gpu`` (or ``--require-gpu``) and the server has no GPU."""


class SessionsUnavailableError(TwoLineError, RuntimeError):
    """``%kcoral session start|attach`` on a server whose features lack ``sessions``."""


class SessionOptionsRefusedError(TwoLineError, ValueError):
    """The server refused ``--gpus`` or ``--idle`` of a new session (400 on create)."""


class SessionSeatsFullError(TwoLineError, RuntimeError):
    """No session seat is free (503 ``busy`` on ``POST /v1/sessions``, EXTENSIONS §11)."""


class SessionEndedError(TwoLineError, RuntimeError):
    """The kernel's session has ended (410 ``session_ended``): its state is gone."""


class SessionBusyError(TwoLineError, RuntimeError):
    """The session runs another program (409 ``session_busy``)."""


class SessionNotFoundError(TwoLineError, LookupError):
    """The server knows no such session for this token (404: unknown, dropped after it
    ended, or another identity's, which answers exactly like an unknown one)."""


class AnswerRefusedError(ServerUnreachableError):
    """The server answered, but its answer was refused, cut short or too slow (no HTTP
    answer the client took, as ``ServerUnreachableError``; but something did answer)."""


#: what to do about an answer the client did not take
NOT_KCORAL_HINT = (
    "is it a KCoral server (or a proxy in front of one)? %kcoral status shows what answers there"
)


#: what to do about an answer larger than the kernel's client reads: the client is built
#: at the server's first use in the kernel, and reads ``KCORAL_MAX_ANSWER_BYTES`` then
TOO_LARGE_HINT = (
    "return less (a session keeps values on the server), or restart the kernel with "
    "KCORAL_MAX_ANSWER_BYTES set to the bytes to read"
)


def unreachable(exc: TransportError, server: str | None = None) -> ServerUnreachableError:
    """A ``TransportError`` as the two lines a user acts on, naming the address tried."""
    where = server or getattr(exc, "url", None) or "the server"
    if exc.answered_but:  # "no answer from URL: got more than 100 headers" was not true
        # an answer over max_answer_bytes may be a KCoral server's honest one
        hint = TOO_LARGE_HINT if isinstance(exc, AnswerTooLarge) else NOT_KCORAL_HINT
        return AnswerRefusedError(answered_but_line(where, exc.answered_but), hint)
    return ServerUnreachableError(f"no answer from {where}: {root_reason(exc)}", start_hint(where))


def start_hint(url: str) -> str:
    """What to do when ``url`` does not answer: the ``kcoral server`` that would serve that
    very address on this machine (its port; none for the default 8000), else a check."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if host in ("127.0.0.1", "localhost", "::1"):
        command = "kcoral server" if port in (None, 8000) else f"kcoral server --port {port}"
        return (
            f"start the server there ({command}) or %kcoral connect to one that runs; "
            "%kcoral local start gives this kernel its own"
        )
    return f"check that a server runs at {url} and answers from here, then %kcoral connect URL"


#: What to do for the HTTP error kinds a user can act on (PROTOCOL §7, EXTENSIONS §5-6).
_ACTIONS = {
    "busy": "every worker is taken: run the cell again in a moment, or use another server",
    # Not "(or KCORAL_TOKEN)": the setting read it at its first use, so a token set in the
    # environment later (%env) is never seen.
    "unauthorized": (
        "set this server's token: %config KCoral.token = '...' (KCORAL_TOKEN is read "
        "only at the extension's first use)"
    ),
    "forbidden": "the server refuses this origin or host; its message names the flag to set",
    "request_too_large": (
        "send less (smaller -i values, --file, --folder), or ask the operator to raise "
        "kcoral server --max-request-bytes"
    ),
    "response_too_large": (
        "return less (smaller -o values, --return-file, --return-folder, the final value), "
        "or ask the operator to raise kcoral server --max-response-bytes"
    ),
    "no_matching_node": "%kcoral status shows what the server (or a router's fleet) "
    "offers: change --select to fit it",
    "not_found": "%kcoral jobs lists the jobs this server keeps for you",
    "job_expired": "run it again, and fetch its result before the bound above drops it",
    "parse": "the server could not read the request; %kcoral status shows its version",
}


def refused(exc: KCoralError, server: str | None = None) -> ServerRefusedError:
    """An HTTP error answer as the two lines a user acts on; status and kind stay readable."""
    where = f"{server} answered " if server else ""
    request = f" [request {exc.request_id}]" if exc.request_id else ""
    if exc.redirect_to is not None:  # it said "HTTP 307 without a KCoral error"
        return ServerRefusedError(
            f"{where or 'the server answered '}HTTP {exc.status_code}, a redirect to "
            f"{exc.redirect_to}, which KCoral never follows (the token and the program would "
            f"go where the URL does not point){request}",
            "if that is the KCoral server, %kcoral connect to its address",
            status_code=exc.status_code,
            kind=None,
        )
    if exc.without_error_body:  # before: "... answered HTTP 502: HTTP 502"
        return ServerRefusedError(
            f"{where or 'the server answered '}HTTP {exc.status_code} without a KCoral error"
            f"{request}",
            "is it a KCoral server (or a proxy in front of one)? %kcoral status shows what "
            "answers there",
            status_code=exc.status_code,
            kind=None,
        )
    kind = f" {exc.kind}" if exc.kind else ""
    action = _ACTIONS.get(
        exc.kind or "", f"%kcoral status shows the server's state; {VERBOSE_HINT}"
    )
    wrong_path = path_not_served_hint(server) if server else ""
    if wrong_path and exc.kind == "not_found" and exc.message == "not found":
        # a route's 404 (a job's or a session's names it): the URL's path is not served, and
        # the jobs hint was no help
        action = wrong_path
    elif exc.kind == "busy" and "shutting down" in exc.message:
        action = "run the cell again once the server is back, or use another server"
    elif exc.kind == "busy" and "must restart" in exc.message:
        # a server that admits nothing until restarted (PROTOCOL §7.1): no retry helps
        action = "ask the server's operator to restart it (its log says why), or use another server"
    # a 401: whether a token was sent, as the client's hint says (the same one either way
    # read "HTTP 401 unauthorized: missing or invalid bearer token")
    cause = token_refusal(exc)
    said = f"{cause} (the server said: {exc.message})" if cause else exc.message
    return ServerRefusedError(
        f"{where}HTTP {exc.status_code}{kind}: {said}{request}",
        action,
        status_code=exc.status_code,
        kind=exc.kind,
    )


def shorten(exc: BaseException, server: str | None = None) -> BaseException:
    """``exc`` as a short error when it is a request-level failure, else ``exc`` itself."""
    if isinstance(exc, TransportError):
        return unreachable(exc, server)
    if isinstance(exc, KCoralError):
        return refused(exc, server)
    if isinstance(exc, SentFileChanged):
        # a traceback through the transport's frames, ending in advice for a script
        # ("in a new Program") where a cell builds its program anew each run
        return FolderChangedError(
            exc.cause, "run the cell again once the folder's files stop changing"
        )
    return exc


@contextmanager
def answered_by(server: str) -> Iterator[None]:
    """A line magic's request failure as ``shorten`` makes it, naming ``server``: left to
    the magic's own handler, ``%kcoral jobs`` said ``HTTP 401 ...`` without saying where,
    where a cell, ``attach`` and ``cancel`` said ``<url> answered HTTP 401 ...``."""
    try:
        yield
    except (TransportError, KCoralError) as exc:
        raise shorten(exc, server) from exc
