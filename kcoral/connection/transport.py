"""What moves bytes for a client: the transport interface and its in-memory and threaded kinds.

The client core (``kcoral.base_client``) turns every call into ``Request`` values and reads
``Response`` values; a transport only sends one and returns the other. ``Client`` uses a
synchronous ``Transport`` (``kcoral.connection.http.HttpTransport``, urllib3), ``AsyncClient`` an
``AsyncTransport``: by default the same urllib3 transport run on a bounded pool of threads
(``ThreadedAsyncTransport``; why threads and not an asyncio HTTP library: CLIENT_API §1).

``MockTransport(handler)`` answers from a function and is both kinds at once, so the same
scenario runs through ``Client`` and ``AsyncClient`` without a server (as httpx's
``MockTransport``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from kcoral.connection.in_flight import InFlight, running
from kcoral.connection.per_process import PerProcess
from kcoral.errors import ProtocolError
from kcoral.protocol.multipart import PIECE_BYTES, BodyChunk

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One HTTP request relative to the client's base URL.

    ``chunks`` is the body in pieces (a large body is sent as given, never joined by the
    client; ``HttpTransport`` joins a small one, up to 64 KiB, into one send), a local
    file's piece read only as it is sent (``body_pieces``); ``None`` sends no body."""

    method: str
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: Sequence[BodyChunk] | None = None
    length: int = 0
    #: seconds the answer may take once sent; None: no bound (a program's own deadline is
    #: the server's to enforce, CLIENT_API §2)
    read_timeout: float | None = None

    def body(self) -> bytes:
        """The whole body as one ``bytes`` (tests and transports that cannot stream)."""
        return b"".join(bytes(piece) for piece in body_pieces(self.chunks or ()))


def body_pieces(chunks: Iterable[BodyChunk]) -> Iterator[bytes | memoryview]:
    """The body's bytes in order, in pieces of at most ``PIECE_BYTES``: a chunk in memory
    as views of it (never copied), a streamed one as it is read (one piece held at a time).
    The one place a body is cut: the progress line and the look for an early answer count
    and check these pieces as they come."""
    for chunk in chunks:
        if isinstance(chunk, (bytes, memoryview)):
            view = memoryview(chunk)
            if view.nbytes <= PIECE_BYTES:  # most chunks: multipart headers, small blobs
                yield chunk
                continue
            if view.format != "B" or view.ndim != 1:  # cut by bytes, not by elements
                view = view.cast("B")
            for start in range(0, view.nbytes, PIECE_BYTES):
                yield view[start : start + PIECE_BYTES]
        else:
            yield from chunk.chunks()


@dataclass(frozen=True)
class Response:
    """A fully read answer; ``headers`` is case-insensitive. ``data`` is ``bytes``, or a
    read-only-by-convention ``memoryview`` for large bodies (``kcoral.connection.http``)."""

    status: int
    headers: Mapping[str, str]
    data: bytes | memoryview


def refuse_encoded_body(headers: Mapping[str, str], what: str) -> None:
    """``ProtocolError`` unless the answer's body is sent as it is: the client asks for
    ``Accept-Encoding: identity``, so a ``Content-Encoding`` other than ``identity`` is a
    broken or hostile server (a few KiB of nested gzip inflate to gigabytes); the body is
    never decoded."""
    encoding = headers.get("Content-Encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        raise ProtocolError(
            f"{what}: the server answered with Content-Encoding {encoding[:64]!r}; "
            "the client accepts only identity"
        )


@runtime_checkable
class Transport(Protocol):
    """Sends one request and reads the whole answer; ``TransportError`` when none came."""

    def handle_request(self, request: Request) -> Response: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncTransport(Protocol):
    """The asynchronous twin of ``Transport``."""

    async def handle_async_request(self, request: Request) -> Response: ...

    async def aclose(self) -> None: ...


class CaseInsensitiveHeaders(dict[str, str]):
    """Answer headers looked up whatever their capitalization (for ``MockTransport``)."""

    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        super().__init__()
        for name, value in (headers or {}).items():
            self[name] = value

    def __setitem__(self, name: str, value: str) -> None:
        super().__setitem__(name.lower(), value)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)


class MockTransport:
    """A transport answered by ``handler(request) -> Response``, in memory; sync and async.

    Headers of the handler's answer become case-insensitive, as a real transport's are."""

    def __init__(self, handler: Callable[[Request], Response]) -> None:
        self.handler = handler
        self.requests: list[Request] = []  # every request seen, in order
        self.closed = False

    def handle_request(self, request: Request) -> Response:
        self.requests.append(request)
        response = self.handler(request)
        return Response(response.status, CaseInsensitiveHeaders(response.headers), response.data)

    async def handle_async_request(self, request: Request) -> Response:
        return self.handle_request(request)

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


class ThreadedAsyncTransport:
    """A blocking ``Transport`` awaited from asyncio: each request runs on one of at most
    ``max_workers`` threads, so callers queue here instead of on connections, and any number
    of event loops (``asyncio.run`` twice, a helper thread's loop) may share the client.

    Cancelling the awaiting task cuts a request already under way (its connection is
    closed, so the server cancels its program, EXTENSIONS §9), and one still queued here is
    never sent. Before, the request ran on to its answer, which was dropped: a cancelled
    program held its worker and GPU up to its deadline."""

    def __init__(self, transport: Transport, *, max_workers: int) -> None:
        self.transport = transport
        self.max_workers = max_workers
        # a forked child makes its own: it has none of its parent's threads
        self._executors = PerProcess(
            lambda: ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kcoral-http")
        )

    async def handle_async_request(self, request: Request) -> Response:
        flight = InFlight()
        future = self._executors.get().submit(self._run, request, flight)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            flight.cut(future)  # a future not started yet was cancelled with the task
            raise

    def _run(self, request: Request, flight: InFlight) -> Response:
        with running(flight):
            return self.transport.handle_request(request)

    def close(self) -> None:
        executor = self._executors.take()
        if executor is not None:
            executor.shutdown(wait=False)
        self.transport.close()

    async def aclose(self) -> None:
        self.close()


#: One client call without I/O: a generator that yields each ``Request`` it needs, is sent
#: each ``Response``, and returns the call's value. ``Client`` and ``AsyncClient`` differ
#: only in how they drive it (``kcoral.base_client``).
Flow = Generator[Request, Response, T]
