"""The synchronous HTTP transport of ``Client`` (urllib3, keep-alive pool, no retries).

urllib3 needs no event loop, so the sync client also works in a thread that already runs
one (a Jupyter kernel). Connecting is bounded by a timeout; a status read's whole answer,
and a program answer's body, by a deadline (``kcoral.connection.answer_deadline``); a
program's run is the server's to bound.

Large bodies (``Content-Length`` of 1 MiB or more) are read straight from the socket into
one reused buffer: on Linux, faulting in fresh memory costs several times a ``memcpy``, and
every value the decoder returns is a copy anyway. Their ``data`` is then a ``memoryview``
that stays valid while referenced; a buffer still referenced is never reused.

The server's word is not trusted with memory: a declared ``Content-Length`` reserves at most
``FIRST_BUFFER_BYTES`` before data arrives, and the buffer doubles (in place, ``realloc``)
only as the body fills it, so memory follows the bytes received. What it reads at all is
bounded (``kcoral.connection.answer_size``): a larger declared length is refused before its
body is read, a body of no stated length is cut once it passes the bound. Bodies are never
decoded: the client asks for ``identity``, and any other ``Content-Encoding`` is a
``ProtocolError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

import urllib3

from kcoral.connection.answer_deadline import (
    BODY_FLOOR_BYTES_PER_SECOND,
    BODY_GRACE_SECONDS,
    AnswerDeadline,
    watched,
)
from kcoral.connection.answer_size import AnswerLimit, answer_limit, answer_too_large
from kcoral.connection.early_answer import EarlyAnswer, stopped_once_answered
from kcoral.connection.keep_alive import pool_manager
from kcoral.connection.per_process import PerProcess, close_inherited_sockets
from kcoral.connection.request_connection import RequestConnection, of_this_thread
from kcoral.connection.transport import Request, Response, body_pieces, refuse_encoded_body
from kcoral.connection.upload_progress import UPLOAD_PROGRESS_BYTES, sent_with_progress
from kcoral.errors import (
    ProtocolError,
    TransportError,
    answered_but,
    head_began,
    transport_error,
)

#: The older name of ``Response`` (answers of this transport).
HttpResponse = Response

_DIRECT_READ_BYTES = 1 << 20
#: A body up to this size goes out joined into one piece: urllib3 sends every piece with its
#: own ``sendall``, and a trivial program's three pieces cost the server extra wake-ups
#: (front-end CPU per reused trip ~5% lower joined, 300-trip blocks alternating); copying
#: 64 KiB takes microseconds. Larger bodies go as given, never copied.
SMALL_BODY_BYTES = 64 << 10
# The reused buffer is kept between requests up to this size (larger answers get their own).
_KEPT_BUFFER_BYTES = 256 << 20
#: A large body's buffer starts at most this big, whatever ``Content-Length`` declares, and
#: doubles each time the body fills it (the kept buffer, when free, is the start).
FIRST_BUFFER_BYTES = 64 << 20


class HttpTransport:
    """One keep-alive connection pool towards one origin."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout_seconds: float,
        max_connections: int = 10,
        max_answer_bytes: int | None = None,
    ) -> None:
        self.base_url = base_url
        #: the largest answer body read; None: bounded by the machine (``answer_size``)
        self.max_answer_bytes = max_answer_bytes
        self._headers = dict(headers)
        # maxsize: connections kept for reuse (more may open at once; they are not kept)
        # connections idle for 5 s are replaced before use (kcoral.connection.keep_alive says why)
        # a forked child gets its own pool: it must not talk on its parent's sockets
        self._connect_timeout = connect_timeout_seconds
        self._pools = PerProcess(
            lambda: pool_manager(
                timeout=urllib3.Timeout(connect=connect_timeout_seconds, read=None),
                retries=False,
                maxsize=max_connections,
            ),
            forget_inherited=close_inherited_sockets,
        )
        self._buffer: bytearray | None = None
        self._buffer_lock = threading.Lock()

    def handle_request(self, request: Request) -> Response:
        """The ``Transport`` interface (``kcoral.connection.transport``)."""
        chunks = request.chunks
        body: Iterable[bytes | memoryview] | None = None
        early: EarlyAnswer | None = None
        if chunks is not None:
            if len(chunks) > 1 and request.length <= SMALL_BODY_BYTES:
                body = (b"".join(body_pieces(chunks)),)
            else:  # cut once, a folder's files read as they are sent
                body = body_pieces(chunks)
                if request.length >= UPLOAD_PROGRESS_BYTES:
                    body = sent_with_progress(body, request.length)
            if request.length > SMALL_BODY_BYTES:
                early = EarlyAnswer()
                body = stopped_once_answered(body, early)
        return self.request(
            request.method,
            request.path,
            body=body,
            content_length=request.length,
            headers=request.headers,
            read_timeout=request.read_timeout,
            early=early,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Iterable[bytes | memoryview] | None = None,
        content_length: int | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        early: EarlyAnswer | None = None,
    ) -> Response:
        """Send one request and read the whole answer (all of it within ``read_timeout``
        seconds, when given; else its body at the floor of ``answer_deadline``).

        ``body`` chunks are streamed as given with an explicit ``Content-Length``. No answer
        -> ``TransportError``. ``KeyboardInterrupt`` closes the connection instead of
        returning it to the pool (the server then cancels the program) and propagates.
        ``early`` tells that the body was cut short by an answer (``stopped_once_answered``):
        that connection is closed, not pooled.
        """
        extra = dict(headers or {})
        overridden = {name.lower() for name in extra}
        # Per-request headers win, whatever their capitalization.
        all_headers = {k: v for k, v in self._headers.items() if k.lower() not in overridden}
        all_headers.update(extra)
        if body is not None:
            all_headers["Content-Length"] = str(content_length)
        # the connection the pool hands this thread, which a deadline (or a cut) shuts
        with of_this_thread() as record:
            response: urllib3.BaseHTTPResponse | None = None
            deadline: AnswerDeadline | None = None
            if read_timeout is not None:
                deadline = watched(time.monotonic() + read_timeout, record)
            try:
                response = self._pools.get().request(
                    method,
                    self.base_url + path,
                    # urllib3 sends each chunk with socket.sendall, which takes any buffer;
                    # its annotation only names bytes and str
                    body=cast("Iterable[bytes] | None", body),
                    headers=all_headers,
                    preload_content=False,
                    decode_content=False,  # never inflate what the server chose to encode
                    redirect=False,
                    **timeout_for(self._connect_timeout, read_timeout),
                )
                if deadline is None:
                    deadline = body_deadline(response, record)
                # a head its deadline cut short ends at the shut, as a whole one would
                head_came = not deadline.passed
                data = self._read_body(response, None if read_timeout else deadline)
                if deadline.end():  # its socket was shut: what came may look whole
                    raise self._late(read_timeout, head_came=head_came, some_came=True)
                status = response.status
                response_headers = response.headers
                if early is not None and early.came:
                    response.close()  # its request was cut short: never reused
                else:
                    response.release_conn()
            except (KeyboardInterrupt, ProtocolError, TransportError):
                # urllib3 closes the connection itself when interrupted before the answer
                # started; once it did, close it here so it never goes back to the pool.
                if response is not None:
                    response.close()
                raise
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if response is not None:
                    response.close()
                timed_out = isinstance(exc, (urllib3.exceptions.ReadTimeoutError, TimeoutError))
                if deadline is not None and (deadline.passed or (read_timeout and timed_out)):
                    # one line whichever bound ran out first: the deadline or a read's timeout
                    raise self._late(
                        read_timeout,
                        head_came=response is not None,
                        some_came=response is not None or head_began(exc),
                    ) from exc
                raise transport_error(self.base_url, exc) from exc
            except MemoryError:
                if response is not None:
                    response.close()
                raise TransportError(
                    f"{method} {self.base_url}{path} failed: the answer does not fit in memory",
                    url=self.base_url,
                ) from None
            finally:
                if deadline is not None:
                    deadline.end()
            return Response(status, response_headers, data)

    def _late(
        self, read_timeout: float | None, *, head_came: bool, some_came: bool
    ) -> TransportError:
        """The error of an answer whose deadline passed (``answer_deadline``): its head
        came, or only ``some_came`` of it (the server was reached), or none of it."""
        url = self.base_url
        if read_timeout is None:
            return answered_but(
                url,
                f"its answer came too slowly: its body has {BODY_GRACE_SECONDS:g} s plus 1 s "
                f"per {BODY_FLOOR_BYTES_PER_SECOND >> 10} KiB",
            )
        if head_came:
            return answered_but(url, f"its answer did not end within {read_timeout} s")
        if some_came:  # a server trickling its head: "cannot reach" was not true
            return answered_but(url, f"its answer's head did not come within {read_timeout} s")
        # as the read timeout says it, which may come first
        message = f"cannot reach {url}: no answer within {read_timeout} s (read timeout)"
        return TransportError(message, url=url)

    def close(self) -> None:
        """Drop every pooled connection; the transport stays usable (it reconnects)."""
        pool = self._pools.peek()
        if pool is not None:
            pool.clear()
        self._buffer = None

    def _read_body(
        self, response: urllib3.BaseHTTPResponse, floor: AnswerDeadline | None
    ) -> bytes | memoryview:
        """The answer's body; ``floor`` (a program's answer) is moved on as a body of no
        stated length comes."""
        headers = response.headers
        refuse_encoded_body(headers, f"answer {response.status}")
        raw = getattr(response, "_fp", None)  # the http.client response urllib3 wraps
        try:
            length = int(headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if "Transfer-Encoding" in headers:
            length = -1  # http.client reads the chunks, whatever a Content-Length beside says
        if length >= _DIRECT_READ_BYTES or (length >= 0 and self.max_answer_bytes is not None):
            limit = answer_limit(self.max_answer_bytes)
            if length > limit.size:
                raise answer_too_large(self.base_url, length, limit, declared=True)
        if length < 0:
            return self._read_unstated(response, floor)
        if length < _DIRECT_READ_BYTES or raw is None or not hasattr(raw, "readinto"):
            return response.read(decode_content=False)
        buffer = self._take_buffer()
        if buffer is None:
            buffer = bytearray(min(length, FIRST_BUFFER_BYTES))
        filled = 0
        while filled < length:
            if filled == len(buffer):
                grow(buffer, min(length, max(2 * len(buffer), FIRST_BUFFER_BYTES)))
            got = raw.readinto(memoryview(buffer)[filled : min(length, len(buffer))])
            if not got:
                raise urllib3.exceptions.ProtocolError(
                    f"connection closed after {filled} of {length} body bytes"
                )
            filled += got
        view = memoryview(buffer)[:length]
        with self._buffer_lock:  # kept for the next answer once ``view`` is let go
            self._buffer = buffer if len(buffer) <= _KEPT_BUFFER_BYTES else None
        return view

    def _read_unstated(
        self, response: urllib3.BaseHTTPResponse, floor: AnswerDeadline | None
    ) -> bytes:
        """A body of no stated length, in pieces, each moving ``floor`` (when given) on by
        its share; cut once it passes the bound, which is looked up when it passes
        ``_DIRECT_READ_BYTES`` (a small body never reads ``/proc/meminfo``)."""
        pieces = []
        came = 0
        limit: AnswerLimit | None = None
        while piece := response.read(_PIECE_BYTES, decode_content=False):
            pieces.append(piece)
            came += len(piece)
            if limit is None and (came >= _DIRECT_READ_BYTES or self.max_answer_bytes is not None):
                limit = answer_limit(self.max_answer_bytes)
            if limit is not None and came > limit.size:
                raise answer_too_large(self.base_url, came, limit, declared=False)
            if floor is not None:
                floor.at = max(floor.at, floor.first_at + came / BODY_FLOOR_BYTES_PER_SECOND)
        return b"".join(pieces)

    def _take_buffer(self) -> bytearray | None:
        """The kept buffer when nothing references it any more (it leaves the slot, so no
        other thread takes it meanwhile), else None."""
        with self._buffer_lock:
            buffer = self._buffer
            if buffer is None or not _unreferenced(buffer):
                return None
            self._buffer = None
            return buffer


def body_deadline(response: urllib3.BaseHTTPResponse, request: RequestConnection) -> AnswerDeadline:
    """A program answer's deadline, from its head on: ``BODY_GRACE_SECONDS`` plus its
    stated length at ``BODY_FLOOR_BYTES_PER_SECOND``, for ``request``'s connection (a body
    of no stated length moves it on as it comes, ``HttpTransport._read_unstated``)."""
    try:
        length = max(0, int(response.headers.get("Content-Length", "")))
    except ValueError:
        length = 0
    return watched(
        time.monotonic() + BODY_GRACE_SECONDS + length / BODY_FLOOR_BYTES_PER_SECOND, request
    )


#: a body of no stated length is read in pieces of this size (``_read_unstated``)
_PIECE_BYTES = 1 << 20


def timeout_for(connect_seconds: float, read_seconds: float | None) -> dict[str, Any]:
    """urllib3's ``timeout`` argument for a request with its own read bound; none (the
    pool's: no read bound) otherwise."""
    if read_seconds is None:
        return {}
    return {"timeout": urllib3.Timeout(connect=connect_seconds, read=read_seconds)}


def grow(buffer: bytearray, size: int) -> None:
    """Make ``buffer`` ``size`` bytes long, in place; ``MemoryError`` when it cannot.

    A large bytearray is ``realloc``ed (its pages move without a copy, and it over-allocates
    an eighth, so few reallocations happen); the new bytes are zeros copied from one small
    zero block that stays in cache: as fast as ``bytearray(size)``, where a ``bytes`` of
    zeros as large as the growth would fault in its pages once more (measured ~30% slower
    for 64 -> 200 MiB).
    """
    while len(buffer) + len(_ZEROS) <= size:
        buffer += _ZEROS
    buffer += _ZEROS[: size - len(buffer)]


_ZEROS = memoryview(bytes(1 << 20))


def _unreferenced(buffer: bytearray) -> bool:
    """True when no ``memoryview`` of ``buffer`` is alive (a bytearray cannot be resized
    while one is, so a one-byte grow-and-shrink tells)."""
    try:
        buffer.append(0)
    except BufferError:
        return False
    del buffer[-1]
    return True
