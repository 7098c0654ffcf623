"""The synchronous HTTP transport of ``Client`` (urllib3, keep-alive pool, no retries).

urllib3 needs no event loop, so the sync client also works in a thread that already runs
one (a Jupyter kernel). Only connecting is bounded by a timeout; reading never times out
because the server enforces execution deadlines itself.

Large bodies (``Content-Length`` of 1 MiB or more) are read straight from the socket into
one reused buffer: on Linux, faulting in fresh memory costs several times a ``memcpy``, and
every value the decoder returns is a copy anyway. Their ``data`` is then a ``memoryview``
that stays valid while referenced; a buffer still referenced is never reused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import cast

import urllib3

from kcoral.connection.keep_alive import pool_manager
from kcoral.connection.transport import Request, Response
from kcoral.errors import TransportError

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


class HttpTransport:
    """One keep-alive connection pool towards one origin."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout_seconds: float,
        max_connections: int = 10,
    ) -> None:
        self.base_url = base_url
        self._headers = dict(headers)
        # maxsize: connections kept for reuse (more may open at once; they are not kept)
        # connections idle for 5 s are replaced before use (kcoral.connection.keep_alive says why)
        self._pool = pool_manager(
            timeout=urllib3.Timeout(connect=connect_timeout_seconds, read=None),
            retries=False,
            maxsize=max_connections,
        )
        self._buffer: bytearray | None = None
        self._buffer_lock = threading.Lock()

    def handle_request(self, request: Request) -> Response:
        """The ``Transport`` interface (``kcoral.connection.transport``)."""
        chunks = request.chunks
        if chunks is not None and len(chunks) > 1 and request.length <= SMALL_BODY_BYTES:
            chunks = (b"".join(chunks),)
        return self.request(
            request.method,
            request.path,
            body=chunks,
            content_length=request.length,
            headers=request.headers,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Iterable[bytes | memoryview] | None = None,
        content_length: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send one request and read the whole answer.

        ``body`` chunks are streamed as given with an explicit ``Content-Length``. No answer
        -> ``TransportError``. ``KeyboardInterrupt`` closes the connection instead of
        returning it to the pool (the server then cancels the program) and propagates.
        """
        extra = dict(headers or {})
        overridden = {name.lower() for name in extra}
        # Per-request headers win, whatever their capitalization.
        all_headers = {k: v for k, v in self._headers.items() if k.lower() not in overridden}
        all_headers.update(extra)
        if body is not None:
            all_headers["Content-Length"] = str(content_length)
        response: urllib3.BaseHTTPResponse | None = None
        try:
            response = self._pool.request(
                method,
                self.base_url + path,
                # urllib3 sends each chunk with socket.sendall, which takes any buffer; its
                # annotation only names bytes and str
                body=cast("Iterable[bytes] | None", body),
                headers=all_headers,
                preload_content=False,
                redirect=False,
            )
            data = self._read_body(response)
            status = response.status
            response_headers = response.headers
            response.release_conn()
        except KeyboardInterrupt:
            # urllib3 closes the connection itself when interrupted before the answer
            # started; once it did, close it here so it never goes back to the pool.
            if response is not None:
                response.close()
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if response is not None:
                response.close()
            raise TransportError(
                f"{method} {self.base_url}{path} failed: {exc}", url=self.base_url
            ) from exc
        return Response(status, response_headers, data)

    def close(self) -> None:
        """Drop every pooled connection; the transport stays usable (it reconnects)."""
        self._pool.clear()
        self._buffer = None

    def _read_body(self, response: urllib3.BaseHTTPResponse) -> bytes | memoryview:
        headers = response.headers
        raw = getattr(response, "_fp", None)  # the http.client response urllib3 wraps
        try:
            length = int(headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if (
            length < _DIRECT_READ_BYTES
            or raw is None
            or not hasattr(raw, "readinto")
            or headers.get("Content-Encoding", "identity").lower() != "identity"
            or "Transfer-Encoding" in headers
        ):
            return response.read()
        view = self._take_buffer(length)
        filled = 0
        while filled < length:
            got = raw.readinto(view[filled:])
            if not got:
                raise urllib3.exceptions.ProtocolError(
                    f"connection closed after {filled} of {length} body bytes"
                )
            filled += got
        return view

    def _take_buffer(self, size: int) -> memoryview:
        """A ``size``-byte view of the kept buffer when nothing references it any more,
        else of a new one (kept instead when small enough)."""
        with self._buffer_lock:
            buffer = self._buffer
            if buffer is None or len(buffer) < size or not _unreferenced(buffer):
                buffer = bytearray(size)
                self._buffer = buffer if size <= _KEPT_BUFFER_BYTES else None
            # exported before the lock is left: other threads now see it in use
            return memoryview(buffer)[:size]


def _unreferenced(buffer: bytearray) -> bool:
    """True when no ``memoryview`` of ``buffer`` is alive (a bytearray cannot be resized
    while one is, so a one-byte grow-and-shrink tells)."""
    try:
        buffer.append(0)
    except BufferError:
        return False
    del buffer[-1]
    return True
