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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kcoral.connection.transport import refuse_encoded_body
from kcoral.errors import KCoralError, ProtocolError, TransportError, transport_error
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.strict_json import loads_strict
from kcoral.response import error_from_response

if TYPE_CHECKING:
    import urllib3

RECONNECT_ATTEMPTS = 8
RECONNECT_FIRST_DELAY_SECONDS = 0.1
RECONNECT_MAX_DELAY_SECONDS = 2.0
#: how long a stream answered 503 is asked again (each second): past a router's restart
#: grace (40 s by default, ROUTER §13), in which its nodes reconnect
UNAVAILABLE_RETRY_SECONDS = 45.0
#: after the ``finished`` event, how long the stream's end may take and how much may come
#: before it: a KCoral server ends the stream right after that event, and reading the end
#: keeps the connection for reuse and has the request logged as completed instead of as a
#: client that left (a router's ``finish_reason``); a server that goes on is hung up on
END_WAIT_SECONDS = 0.5
END_WAIT_BYTES = 64 * 1024
#: Bounds on what a server may send in an event stream (EXTENSIONS §5): a line other than
#: ``data:`` (ids, event names, comments), the data of one event (a KCoral server sends one
#: ``data:`` line, which for ``stdout``/``stderr`` holds at most 4 MiB of output escaped as
#: JSON; servers before 2026-12-05 sent the rest of a job's output at its end as one, up to
#: an output limit, hence the room), its data lines, and the digits of an id (an int64 has 19).
MAX_LINE_BYTES = 1 << 20
MAX_EVENT_DATA_BYTES = 256 << 20
MAX_EVENT_DATA_LINES = 1024
MAX_EVENT_ID_DIGITS = 19


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
    """Incremental ``text/event-stream`` parser: ``feed(bytes)`` returns complete events.

    Linear in what arrives (one growing buffer, each byte searched for a line end once), and
    bounded whatever the server sends (EXTENSIONS §5): a line other than ``data:`` of more
    than ``MAX_LINE_BYTES``, a ``data:`` line or an event's data of more than
    ``MAX_EVENT_DATA_BYTES``, more than ``MAX_EVENT_DATA_LINES`` data lines in one event, or
    an id of more than ``MAX_EVENT_ID_DIGITS`` digits -> ``ProtocolError``, raised as soon as
    the limit is passed (a line without its end is not waited for).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()  # the line being received (its start: what is left)
        self._scanned = 0  # how much of ``_buffer`` holds no line end
        self._id: str | None = None
        self._kind = "message"
        self._data: list[str] = []
        self._data_bytes = 0

    def feed(self, chunk: bytes) -> list[JobEvent]:
        buffer = self._buffer
        buffer += chunk
        events: list[JobEvent] = []
        start = 0
        while True:
            end = buffer.find(b"\n", max(start, self._scanned))
            if end < 0:
                break
            _check_line(buffer, start, end)
            line = bytes(buffer[start:end]).rstrip(b"\r").decode("utf-8", errors="replace")
            start = end + 1
            event = self._line(line)
            if event is not None:
                events.append(event)
        del buffer[:start]  # O(1) for a bytearray's front
        self._scanned = len(buffer)
        _check_line(buffer, 0, len(buffer))
        return events

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
            self._data_bytes += len(value)
            if len(self._data) >= MAX_EVENT_DATA_LINES:
                raise ProtocolError(f"job event with more than {MAX_EVENT_DATA_LINES} data lines")
            if self._data_bytes > MAX_EVENT_DATA_BYTES:
                raise ProtocolError(f"job event data over {MAX_EVENT_DATA_BYTES} bytes")
            self._data.append(value)
        return None

    def _dispatch(self) -> JobEvent | None:
        event_id, kind, data = self._id, self._kind, self._data
        self._kind, self._data, self._data_bytes = "message", [], 0
        if event_id is None and not data:
            return None
        if event_id is None or not (event_id.isascii() and event_id.isdigit()):
            raise ProtocolError(f"job event without a numeric id: {event_id!r:.80}")
        if len(event_id) > MAX_EVENT_ID_DIGITS:
            raise ProtocolError(f"job event id of {len(event_id)} digits")
        try:
            value = loads_strict("\n".join(data).encode("utf-8")) if data else {}
        except ValidationError as exc:
            raise ProtocolError(f"job event {event_id}: invalid JSON data: {exc}") from None
        if not isinstance(value, dict):
            raise ProtocolError(f"job event {event_id}: data is not a JSON object")
        return JobEvent(int(event_id), kind, value)


def _check_line(buffer: bytearray, start: int, end: int) -> None:
    """``ProtocolError`` when the line ``buffer[start:end]`` (whole or not yet ended) is
    longer than a line of its field may be."""
    length = end - start
    if length <= MAX_LINE_BYTES:
        return
    if not buffer.startswith(b"data:", start):
        raise ProtocolError(f"job event stream line over {MAX_LINE_BYTES} bytes")
    if length > MAX_EVENT_DATA_BYTES:
        raise ProtocolError(f"job event data over {MAX_EVENT_DATA_BYTES} bytes")


def _back_off_delay(failures: int) -> float:
    """How long to wait before the ``failures``-th attempt to reopen a stream (0.1 s
    doubling, at most 2 s: about 9 s over ``RECONNECT_ATTEMPTS``)."""
    delay: float = RECONNECT_FIRST_DELAY_SECONDS * 2 ** (failures - 1)
    return min(delay, RECONNECT_MAX_DELAY_SECONDS)


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
        if type(last_event_id) is not int or last_event_id < 0:
            # checked here: '2' failed deep in the reading loop ('<=' not supported)
            raise (TypeError if type(last_event_id) is not int else ValueError)(
                "last_event_id must be a whole number >= 0 (the id of the last event handled), "
                f"not {last_event_id!r}"
            )
        self.pool = pool
        self.url = url
        self.headers = dict(headers)
        self.last_event_id = last_event_id
        self.read_timeout = read_timeout
        self._response: Any = None
        self._closed = False
        self._lock = threading.Lock()
        #: whether the job has finished (its state, asked when a stream ends early); set by
        #: the job that opened the stream
        self.job_finished: Callable[[], bool] | None = None
        #: adds to a refusal what the user can do about it (a 401's token hint); set by the
        #: client that opened the stream, which knows the URL and where its token came from
        self.refused: Callable[[KCoralError], None] | None = None

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
        unavailable_since: float | None = None  # the first of the 503s in a row
        unreachable_since: float | None = None  # the first of the failed connections in a row
        over = False  # the job had finished when this connection opened
        while not self._closed:
            delivered = False
            try:
                for event in self._one_connection(urllib3):
                    failures, unavailable_since, delivered = 0, None, True
                    unreachable_since = None
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
                    raise transport_error(self.url, exc) from exc
                # Within a read timeout, as a 503's asking: `result(timeout=3)` on a server
                # that had gone took the whole back-off, 9 s (jobs soak).
                unreachable_since = unreachable_since or time.monotonic()
                self._wait_within_timeout(
                    unreachable_since, _back_off_delay(failures), transport_error(self.url, exc)
                )
            except KCoralError as exc:
                # 503: not now (a router that just restarted, whose node holding the job is
                # not back yet, ROUTER §13; no free slot): asked again each second for up to
                # UNAVAILABLE_RETRY_SECONDS. Before, the first 503 ended the iteration, and
                # `kcoral run` gave up a job that went on running.
                if exc.status_code != 503 or self._closed:
                    if self.refused is not None:
                        self.refused(exc)
                    raise
                now = time.monotonic()
                unavailable_since = unavailable_since or now
                if now - unavailable_since > UNAVAILABLE_RETRY_SECONDS:
                    raise
                # A read timeout bounds the asking too: no event came within it. A job's
                # `result(timeout=5)` waited the whole 45 s here (jobs soak).
                self._wait_within_timeout(unavailable_since, 1.0, exc)
                continue
            else:
                # The stream ended before ``finished``. A finished job's stream sends all its
                # events after ``Last-Event-ID`` and ends: opened once the job had finished,
                # one that brings nothing means nothing follows (the caller resumed after the
                # ``finished`` event), where reconnecting ended in 'keeps ending'.
                if over and not delivered:
                    if self.last_event_id > 0:
                        return
                    # From the start, a finished job's stream holds at least its `finished`
                    # event while its record lives (EXTENSIONS §5): ending the iteration
                    # would pass for a job that said nothing and never finished.
                    raise ProtocolError(
                        f"GET {self.url}: the job has finished but its event stream holds no event"
                    )
                if self.job_finished is not None and not self._closed:
                    with contextlib.suppress(Exception):  # unknown: the reconnect tells
                        over = self.job_finished()
                failures += 1  # reconnect
                if failures > RECONNECT_ATTEMPTS:
                    raise TransportError(f"GET {self.url}: the event stream keeps ending")

    def _wait_within_timeout(
        self, since: float, delay: float, why: KCoralError | TransportError
    ) -> None:
        """Wait ``delay`` before asking again, or less where the read timeout, counted from
        ``since`` (the first failure in a row), ends first; past it ``TimeoutError``."""
        if self.read_timeout is not None:
            left = since + self.read_timeout - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no job event within the timeout: {why}") from None
            delay = min(delay, left)
        time.sleep(delay)

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
            decode_content=False,  # never inflate what the server chose to encode
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
            refuse_encoded_body(response.headers, f"GET {self.url}")
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
        self._pools: Any = None  # a PerProcess of the stream pool, made on first use

    def open(
        self, path: str, *, last_event_id: int = 0, read_timeout: float | None = None
    ) -> EventSource:
        """The event stream at ``path`` (nothing is sent until it is iterated)."""
        if self._pools is None:
            import urllib3

            from kcoral.connection.keep_alive import pool_manager
            from kcoral.connection.per_process import PerProcess, close_inherited_sockets

            # a stream's connection idle for 5 s is replaced before use
            # (kcoral.connection.keep_alive); a forked child gets its own pool
            # (kcoral.connection.per_process)
            timeout = urllib3.Timeout(connect=self.connect_timeout_seconds, read=None)
            self._pools = PerProcess(
                lambda: pool_manager(timeout=timeout, retries=False, maxsize=self.max_connections),
                forget_inherited=close_inherited_sockets,
            )
        return EventSource(
            self._pools.get(),
            self.base_url + path,
            self.headers,
            last_event_id=last_event_id,
            read_timeout=read_timeout,
        )

    def clear(self) -> None:
        """Close idle stream connections; the pool stays usable."""
        pool = self._pools.peek() if self._pools is not None else None
        if pool is not None:
            pool.clear()
