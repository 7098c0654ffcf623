"""The client core: everything ``Client`` and ``AsyncClient`` share, written once.

Constructor checks, default headers (token, user agent), request building, the cache
negotiation of PROTOCOL.md §9.3, answer decoding, errors, the ``/v1/info`` version warning
and job submission live here as *flows* (``kcoral.connection.transport.Flow``): generators that
yield
each request they need and receive its answer, without I/O. The two flavours only drive
flows over their transport (a loop in ``Client``, an awaiting loop in ``AsyncClient``), so
they cannot drift apart (httpx's ``BaseClient`` is the model).
"""

from __future__ import annotations

import copy
import math
import os
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar, cast

import kcoral
from kcoral.connection.answer_deadline import STATUS_ANSWER_SECONDS
from kcoral.connection.answer_size import chosen_bound
from kcoral.connection.event_stream import EventSource, EventStreams
from kcoral.connection.negotiation import Attempt, ExecuteNegotiation
from kcoral.connection.request_limit import KnownLimit
from kcoral.connection.server_address import server_url
from kcoral.connection.transport import Flow, Request, Response
from kcoral.errors import KCoralError, ProtocolError
from kcoral.jobs import (
    JobList,
    check_job_id,
    decode_job_list,
    next_submission_step,
    require_jobs,
)
from kcoral.program import Program
from kcoral.protocol.headers import PRINTABLE_TOKEN
from kcoral.protocol.selector import SelectorInput, check_select
from kcoral.protocol.strict_json import nested_deeper_than
from kcoral.response import (
    decode_health,
    decode_json_object,
    decode_target,
    error_from_response,
    health_error,
)
from kcoral.results import ProgramResult
from kcoral.run.terminal_filter import screened

if TYPE_CHECKING:
    from kcoral.async_client import AsyncClient
    from kcoral.client import Client
    from kcoral.remote import RemoteFunction

TOKEN_ENV = "KCORAL_TOKEN"
T = TypeVar("T")
#: ``/v1/info`` nests a few levels (``fleet_status``); deeper is refused, so the copy every
#: caller gets stays far from the recursion limit
MAX_INFO_DEPTH = 64


def client_version() -> str:
    """This client's version (``kcoral.__version__``, the installed distribution's)."""
    return kcoral.__version__


def check_base_url(base_url: object) -> str:
    """``base_url`` as the URL it names, by the one address rule of
    ``kcoral.connection.server_address``
    (``host:port`` means ``http://host:port``); ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(base_url, str):
        raise TypeError(f"base_url must be a str, not {type(base_url).__name__}")
    try:
        return server_url(base_url)
    except ValueError as exc:
        raise ValueError(f"base_url: {exc}") from None


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def attempt_request(path: str, attempt: Attempt) -> Request:
    """The ``POST`` carrying one negotiation attempt."""
    return Request("POST", path, attempt.headers, attempt.chunks, attempt.length)


def sent_attempt(path: str, attempt: Attempt, limit: KnownLimit) -> Flow[Response]:
    """The answer to one negotiation attempt; a large body over the limit the server's
    ``/v1/info`` states (``limit``, the client's) is refused unsent (``RequestTooLarge``,
    CLIENT_API §2.1 step 11)."""
    yield from limit.check(attempt.length, _get_status("/v1/info"))
    response = yield attempt_request(path, attempt)
    limit.answered(response.status)
    return response


#: how long ``health()``, ``target()``, ``info()``, a job's state and the job list wait for
#: their whole answer once asked (``kcoral.connection.answer_deadline``): a server answers
#: them at once, and one that is frozen (stopped, swapped out, a hung proxy) or trickles its
#: answer made them wait for ever, with a notebook's status cell (CLIENT_API §1)
STATUS_READ_TIMEOUT_SECONDS = STATUS_ANSWER_SECONDS


def _get_status(path: str) -> Request:
    return Request("GET", path, read_timeout=STATUS_READ_TIMEOUT_SECONDS)


#: what a 401's hint says where no token was sent (``token_hint``; ``token_refusal`` reads it)
NO_TOKEN_SENT = "no token was sent"


def token_hint(url: str, source: str | None) -> str:
    """What a 401 from ``url`` says to do, given where the token sent came from (``None``:
    none was sent)."""
    fix = f"set {TOKEN_ENV}, or pass Client(url, token=...)"
    if source is None:
        return f"the server at {url} needs a token (401), and {NO_TOKEN_SENT}: {fix}"
    origin = "" if source == "token" else f" (from {source})"
    return f"the server at {url} refused the token{origin} (401): {fix}"


def token_refusal(exc: KCoralError) -> str | None:
    """Which of a 401's two causes the client that made the request saw (its ``hint``):
    "no token was sent" or "the token sent was refused"; None for another answer, or a 401
    no client hinted (the notebook, which names its own setting, says which with this)."""
    if exc.status_code != 401 or not exc.hint:
        return None
    return NO_TOKEN_SENT if f", and {NO_TOKEN_SENT}: " in exc.hint else "the token sent was refused"


def bearer_token(token: str, source: str) -> str:
    """``token`` without the whitespace at its ends (a newline read with a file: no token
    holds one); a ``ValueError`` naming ``source`` when what is left cannot be a token. The
    error never shows the token: the HTTP library's own refusal of such a header printed
    it whole ('Invalid header value b'Bearer ...'')."""
    stripped = token.strip(" \t\r\n")
    if PRINTABLE_TOKEN.fullmatch(stripped) is None:
        # A value copied from an Authorization header is the likeliest such mistake: say so,
        # still without showing the token.
        pasted_header = stripped[:7].lower() == "bearer "
        fix = "; give the token alone, without 'Bearer '" if pasted_header else ""
        raise ValueError(
            f"{source} holds a character no bearer token can hold (only printable ASCII "
            f"without spaces){fix}; the value is not shown: it may be a secret"
        )
    return stripped


class BaseClient:
    """Settings and flows of one KCoral server or router. Construction never contacts it.

    Subclasses set ``is_async`` and drive flows with ``run_flow``."""

    #: ``True`` for the flavour whose calls are coroutines.
    is_async: ClassVar[bool] = False

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_seconds: float = 10.0,
        token: str | None = None,
        max_connections: int = 64,
        max_answer_bytes: int | None = None,
    ) -> None:
        url = check_base_url(base_url)
        if (
            isinstance(connect_timeout_seconds, bool)
            or not isinstance(connect_timeout_seconds, (int, float))
            or not math.isfinite(connect_timeout_seconds)
            or connect_timeout_seconds <= 0
        ):
            raise ValueError("connect_timeout_seconds must be a finite number > 0")
        extra = dict(headers or {})
        for name, value in extra.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise TypeError("headers must map str to str")
        source = "token"
        given_authorization = any(name.lower() == "authorization" for name in extra)
        if token is None and not given_authorization:  # what the caller wrote wins
            token, source = os.environ.get(TOKEN_ENV) or None, TOKEN_ENV
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a str")
        if token:
            token = bearer_token(token, source)
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise TypeError("max_connections must be an int")
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        #: the largest answer read; None: bounded by the machine (EXTENSIONS §17)
        self.max_answer_bytes = chosen_bound(max_answer_bytes)

        request_headers = {"User-Agent": f"kcoral/{client_version()}"}
        _set_headers(request_headers, extra)
        if token:
            _set_headers(request_headers, {"Authorization": f"Bearer {token}"})
        self.base_url = url
        # where the token came from, for a 401's hint (never the token itself)
        self._token_source = (
            source if token else "an Authorization header" if given_authorization else None
        )
        self.connect_timeout_seconds = float(connect_timeout_seconds)
        self.max_connections = max_connections
        self.headers: Mapping[str, str] = request_headers  # sent with every request
        self._info: dict[str, Any] | None = None
        self._info_lock = threading.Lock()
        self._request_limit = KnownLimit()  # asked before the first large body, then kept
        # Event streams are long-lived and read by blocking threads in both flavours.
        self._streams = EventStreams(
            url,
            request_headers,
            connect_timeout_seconds=self.connect_timeout_seconds,
            max_connections=max_connections,
        )

    def __repr__(self) -> str:
        # Never show headers: they may carry the token.
        return f"{type(self).__name__}({self.base_url!r})"

    def __reduce__(self) -> NoReturn:
        # A client holds sockets, threads and its token: none of them travels to another
        # process (a multiprocessing pool's argument, a pickle-mode function's global); it
        # failed as "cannot pickle '_thread.lock' object", which named none of this.
        name = type(self).__name__
        raise TypeError(
            f"a kcoral.{name} cannot be pickled: make one in each process from its URL and "
            "token (a token never goes into a pickle)"
        )

    # -- flows ---------------------------------------------------------------------------

    def health_flow(self) -> Flow[dict[str, Any]]:
        """``GET /health``, validated (CLIENT_API §2)."""
        response = yield _get_status("/health")
        if response.status != 200:
            raise health_error(response.status, response.headers, response.data)
        return decode_health(response.data)

    def target_flow(self) -> Flow[dict[str, str]]:
        return decode_target((yield from self.health_flow()))

    def info_flow(self) -> Flow[dict[str, Any]]:
        """``GET /v1/info`` once per client (EXTENSIONS §1); one ``UserWarning`` when the
        server's major.minor version differs from this client's."""
        if self._info is None:
            response = yield _get_status("/v1/info")
            if response.status != 200:
                raise error_from_response(response.status, response.headers, response.data)
            info = decode_json_object(response.data, "/v1/info response")
            if nested_deeper_than(info, MAX_INFO_DEPTH):  # each caller gets a deep copy
                raise ProtocolError(f"/v1/info response nested over {MAX_INFO_DEPTH} levels")
            with self._info_lock:
                first = self._info is None
                if first:
                    self._info = info
            server_version = info.get("kcoral")
            ours = client_version()
            if (
                first
                and isinstance(server_version, str)
                and _major_minor(server_version) != _major_minor(ours)
            ):
                warnings.warn(
                    # a warning is printed to the user's terminal as it is: the server's
                    # text in it screened (kcoral.run.terminal_filter.screened)
                    f"KCoral server version {screened(server_version)} differs from client "
                    f"version {ours}",
                    UserWarning,
                    stacklevel=4,
                )
        assert self._info is not None  # set above, by this call or an earlier one
        return copy.deepcopy(self._info)

    def execute_flow(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
        select: SelectorInput = None,
        path: str = "/execute",
    ) -> Flow[ProgramResult]:
        """``POST /execute`` with the cache negotiation of PROTOCOL §9.3 (CLIENT_API §2.1);
        ``path`` is a session's execute path for a program in a session (EXTENSIONS §11);
        ``select`` is sent as ``X-KCoral-Select`` on every attempt (EXTENSIONS §14)."""
        negotiation = ExecuteNegotiation(
            program,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
            serialization=serialization,
            select=check_select(select),
        )
        attempt = negotiation.first_attempt()
        while True:
            response = yield from sent_attempt(path, attempt, self._request_limit)
            outcome = negotiation.handle_response(
                response.status,
                response.headers,
                response.headers.get("Content-Type"),
                response.data,
            )
            if isinstance(outcome, ProgramResult):
                return outcome
            attempt = outcome

    def submit_flow(
        self,
        program: Program,
        *,
        timeout_seconds: float | None = None,
        output_limit_bytes: int | None = None,
        gpu_count: int | None = None,
        serialization: str | None = None,
        select: SelectorInput = None,
        path: str = "/v1/jobs",
    ) -> Flow[tuple[str, str, tuple[str, ...]]]:
        """``POST /v1/jobs`` (EXTENSIONS §5): ``(job id, request id, the program's blobs)``;
        ``path`` is a session's jobs path for a job in a session (EXTENSIONS §11).

        Arguments are checked before anything is sent; ``KCoralError`` (kind
        ``unavailable``) when the server does not list feature ``jobs``."""
        negotiation = ExecuteNegotiation(
            program,
            timeout_seconds=timeout_seconds,
            output_limit_bytes=output_limit_bytes,
            gpu_count=gpu_count,
            serialization=serialization,
            select=check_select(select),
        )
        try:
            info = yield from self.info_flow()
        except KCoralError as exc:
            if exc.status_code != 404:
                raise
            info = {}  # a server without /v1/info offers no jobs
        require_jobs(info.get("features"), self.base_url)
        known_blobs = tuple(program.blobs)
        step: tuple[str, str] | Attempt = negotiation.first_attempt()
        while isinstance(step, Attempt):
            response = yield from sent_attempt(path, step, self._request_limit)
            step = next_submission_step(
                negotiation,
                response.status,
                response.headers,
                response.headers.get("Content-Type"),
                response.data,
            )
        job_id, request_id = step
        return job_id, request_id, known_blobs

    def jobs_flow(self, limit: int | None = None) -> Flow[JobList]:
        """``GET /v1/jobs`` (EXTENSIONS §5): the caller's recent jobs, newest first; at
        most ``limit`` of them (the server's default: 1000; its most: 10000). The list says
        what it is missing: ``left_out``, ``nodes_left_out`` (``JobList``)."""
        path = "/v1/jobs"
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"limit must be a positive integer (got {limit!r})")
            path += f"?limit={limit}"
        response = yield _get_status(path)
        if response.status != 200:
            raise error_from_response(response.status, response.headers, response.data)
        return decode_job_list(response.data, response.headers)

    def request_flow(
        self, method: str, path: str, *, headers: Mapping[str, str] | None = None
    ) -> Flow[Response]:
        """One plain request; the answer as it came (any status)."""
        return (yield Request(method, path, dict(headers or {})))

    # -- shared members ------------------------------------------------------------------

    def hinted(self, flow: Flow[T]) -> Flow[T]:
        """``flow``, whose 401 says where a token comes from: ``HTTP 401: unauthorized``
        alone left a new user to find ``KCORAL_TOKEN`` in the README."""
        try:
            return (yield from flow)
        except KCoralError as exc:
            self.hint_a_refused_token(exc)
            raise

    def hint_a_refused_token(self, exc: KCoralError) -> None:
        """Give a 401 from this client's server the hint of where a token comes from."""
        if exc.status_code == 401 and not exc.hint:
            exc.hint = token_hint(self.base_url, self._token_source)

    def run_flow(self, flow: Flow[Any]) -> Any:
        """Drive ``flow`` over this client's transport (a coroutine in ``AsyncClient``)."""
        raise NotImplementedError

    def check_job_id(self, job_id: object) -> str:
        return check_job_id(job_id)

    def event_source(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource:
        """A blocking Server-Sent Events stream at ``path`` (used by jobs); streams use their
        own connections, kept apart from the request pool."""
        source = self._streams.open(path, last_event_id=last_event_id, read_timeout=read_timeout)
        # a stream's 401 said only "HTTP 401: ..." where every other request names the token
        source.refused = self.hint_a_refused_token
        return source

    def function(
        self,
        bare: object = None,
        /,
        *,
        timeout: float | None = None,
        output_limit_bytes: int | None = None,
        cpu_only: bool = False,
        serialization: str = "json",
        select: SelectorInput = None,
    ) -> Callable[[Callable[..., Any]], RemoteFunction]:
        """Decorator returning a ``RemoteFunction`` bound to this client (CLIENT_API §8);
        every call sends ``select`` (EXTENSIONS §14)."""
        # Imported on first use: source capture (ast, dis, inspect) costs import time.
        from kcoral.remote import refuse_bare_decorator, remote_function_decorator

        refuse_bare_decorator(bare, "client")
        return remote_function_decorator(
            cast("Client | AsyncClient", self),
            timeout=timeout,
            output_limit_bytes=output_limit_bytes,
            cpu_only=cpu_only,
            serialization=serialization,
            select=check_select(select),  # checked now, before any function is decorated
        )

    def close_event_streams(self) -> None:
        """Close idle event-stream connections (part of ``close``/``aclose``)."""
        self._streams.clear()


def _set_headers(headers: dict[str, str], new: Mapping[str, str]) -> None:
    """Set ``new`` in ``headers``, each replacing a header of the same name in any case:
    HTTP names are case-insensitive, and ``{"authorization": ...}`` beside a token sent two
    ``Authorization`` headers, which a server refuses (401)."""
    for name, value in new.items():
        for same in [key for key in headers if key.lower() == name.lower()]:
            del headers[same]
        headers[name] = value
