"""Server-Sent Events of a job (EXTENSIONS §5): ``JobEvent``, the parser, a reconnecting reader.

Streams are read with urllib3 from a blocking thread in both clients (``AsyncJob`` pumps the
events into its event loop), so closing a stream is immediate and no event loop of our own
is ever started. A dropped stream is reopened with ``Last-Event-ID`` (the server replays what
followed), so an iteration sees every event once, in order, and ends after the ``finished``
phase.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kcoral.errors import ProtocolError, TransportError
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.strict_json import loads_strict
from kcoral.response import error_from_response

if TYPE_CHECKING:
    import urllib3

RECONNECT_ATTEMPTS = 8
RECONNECT_FIRST_DELAY_SECONDS = 0.1
RECONNECT_MAX_DELAY_SECONDS = 2.0
#: after the ``finished`` event, how long the stream's end may take and how much may come
#: before it: a KCoral server ends the stream right after that event, and reading the end
#: keeps the connection for reuse and has the request logged as completed instead of as a
#: client that left (a router's ``finish_reason``); a server that goes on is hung up on
END_WAIT_SECONDS = 0.5
END_WAIT_BYTES = 64 * 1024


@dataclass(frozen=True)
class JobEvent:
    """One Server-Sent Event of a job: ``kind`` is ``phase``, ``stdout``, ``stderr`` or
    ``heartbeat``; ``data`` its JSON object (``{"text": ...}`` for output)."""

    id: int
    kind: str
    data: dict[str, Any]

    @property
    def text(self) -> str:
        """The output text of a ``stdout``/``stderr`` event ("" for others)."""
        value = self.data.get("text")
        return value if isinstance(value, str) else ""

    @property
    def finished(self) -> bool:
        """True for the last event of a job (the ``finished`` phase)."""
        return self.kind == "phase" and self.data.get("phase") == "finished"


class SseParser:
    """Incremental ``text/event-stream`` parser: ``feed(bytes)`` returns complete events."""

    def __init__(self) -> None:
        self._buffer = b""
        self._id: str | None = None
        self._kind = "message"
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[JobEvent]:
        self._buffer += chunk
        events: list[JobEvent] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return events
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8", errors="replace")
            self._buffer = self._buffer[end + 1 :]
            event = self._line(line)
            if event is not None:
                events.append(event)

    def _line(self, line: str) -> JobEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._kind = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> JobEvent | None:
        event_id, kind, data = self._id, self._kind, self._data
        self._kind, self._data = "message", []
        if event_id is None and not data:
            return None
        if event_id is None or not (event_id.isascii() and event_id.isdigit()):
            raise ProtocolError(f"job event without a numeric id: {event_id!r}")
        try:
            value = loads_strict("\n".join(data).encode("utf-8")) if data else {}
        except ValidationError as exc:
            raise ProtocolError(f"job event {event_id}: invalid JSON data: {exc}") from None
        if not isinstance(value, dict):
            raise ProtocolError(f"job event {event_id}: data is not a JSON object")
        return JobEvent(int(event_id), kind, value)


class EventSource:
    """A job's event stream over blocking HTTP, reconnecting with ``Last-Event-ID``.

    Iterate once; ``close()`` (from any thread) ends the iteration.
    """

    def __init__(
        self,
        pool: urllib3.PoolManager,
        url: str,
        headers: Mapping[str, str],
        *,
        last_event_id: int = 0,
        read_timeout: float | None = None,
    ) -> None:
        self.pool = pool
        self.url = url
        self.headers = dict(headers)
        self.last_event_id = last_event_id
        self.read_timeout = read_timeout
        self._response: Any = None
        self._closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()  # wakes a blocked read in another thread
            with contextlib.suppress(Exception):
                response.close()

    def __iter__(self) -> Iterator[JobEvent]:
        import urllib3

        failures = 0
        while not self._closed:
            try:
                for event in self._one_connection(urllib3):
                    failures = 0
                    yield event
                    if event.finished:
                        return
            except urllib3.exceptions.ReadTimeoutError:
                raise TimeoutError("no job event within the timeout") from None
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if self._closed:
                    return
                failures += 1
                if failures > RECONNECT_ATTEMPTS:
                    raise TransportError(f"GET {self.url} failed: {exc}") from exc
                delay = RECONNECT_FIRST_DELAY_SECONDS * 2 ** (failures - 1)
                time.sleep(min(delay, RECONNECT_MAX_DELAY_SECONDS))
            else:
                failures += 1  # the stream ended before ``finished``: reconnect
                if failures > RECONNECT_ATTEMPTS:
                    raise TransportError(f"GET {self.url}: the event stream keeps ending")

    def _one_connection(self, urllib3: Any) -> Iterator[JobEvent]:
        headers = dict(self.headers)
        headers["Accept"] = "text/event-stream"
        if self.last_event_id:
            headers["Last-Event-ID"] = str(self.last_event_id)
        response = self.pool.request(
            "GET",
            self.url,
            headers=headers,
            preload_content=False,
            redirect=False,
            timeout=urllib3.Timeout(read=self.read_timeout),
        )
        with self._lock:
            self._response = response
            if self._closed:
                response.close()
                return
        chunks: Iterator[bytes] | None = None
        finished = False
        try:
            if response.status != 200:
                raise error_from_response(response.status, response.headers, response.read())
            parser = SseParser()
            chunks = response.read_chunked() if response.chunked else _read1(response)
            for chunk in chunks:
                for event in parser.feed(chunk):
                    if event.id <= self.last_event_id:
                        continue  # never twice, whatever the server replays
                    self.last_event_id = event.id
                    finished = finished or event.finished
                    yield event
            chunks = None  # read to its end
        finally:
            with self._lock:
                self._response = None
                closed = self._closed  # another thread hung up: it shut the socket
            if finished and chunks is not None and not closed and _read_to_end(response, chunks):
                response.release_conn()
            else:
                response.close()


def _read_to_end(response: Any, chunks: Iterator[bytes]) -> bool:
    """Read what is left of a stream whose ``finished`` event came; True when it ended within
    ``END_WAIT_SECONDS`` and ``END_WAIT_BYTES`` (the connection can be reused)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is None:
        return False
    deadline = time.monotonic() + END_WAIT_SECONDS
    received = 0
    try:
        sock.settimeout(END_WAIT_SECONDS)  # urllib3 sets its own again on the next request
        for chunk in chunks:
            received += len(chunk)
            if received > END_WAIT_BYTES or time.monotonic() > deadline:
                return False
    except Exception:  # a timeout, a reset, a malformed end: hang up as before
        return False
    return True


def _read1(response: Any) -> Iterator[bytes]:
    while True:
        data = response.read1(65536)
        if not data:
            return
        yield data


class EventStreams:
    """A client's event streams: one lazily made urllib3 pool, kept apart from the request
    pool because streams are long-lived. ``headers`` is read when a stream opens."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        connect_timeout_seconds: float,
        max_connections: int,
    ) -> None:
        self.base_url = base_url
        self.headers = headers
        self.connect_timeout_seconds = connect_timeout_seconds
        self.max_connections = max_connections
        self._pool: Any = None

    def open(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource:
        """The event stream at ``path`` (nothing is sent until it is iterated)."""
        if self._pool is None:
            import urllib3

            from kcoral.connection.keep_alive import pool_manager

            # a stream's connection idle for 5 s is replaced before use
            # (kcoral.connection.keep_alive)
            self._pool = pool_manager(
                timeout=urllib3.Timeout(connect=self.connect_timeout_seconds, read=None),
                retries=False,
                maxsize=self.max_connections,
            )
        return EventSource(
            self._pool,
            self.base_url + path,
            self.headers,
            last_event_id=last_event_id,
            read_timeout=read_timeout,
        )

    def clear(self) -> None:
        """Close idle stream connections; the pool stays usable."""
        if self._pool is not None:
            self._pool.clear()
