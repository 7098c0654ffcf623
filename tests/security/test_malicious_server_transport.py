"""A malicious KCoral server against the client's reading of answers: memory and crashes.

The attacker is the server (or whoever answers on its URL): a real HTTP server on loopback
writes raw answers that an honest server never would: encoded bodies the client never asked
for, a ``Content-Length`` it never sends, event streams with endless lines or ids, JSON
nested to the recursion limit, tensor shapes NumPy cannot hold. Whatever it sends, the
client raises ``ProtocolError`` (a malformed answer) or ``TransportError`` (a broken one,
CLIENT_API §9) and holds no more memory than what was received (checked with ``tracemalloc``
under a small declared limit, never by allocating gigabytes).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import threading
import tracemalloc
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from stand_in_http import StandIn, serving

from kcoral import Client, Program
from kcoral.connection import event_stream
from kcoral.connection import http as client_http
from kcoral.connection.http import HttpTransport
from kcoral.errors import ProtocolError, TransportError
from kcoral.protocol.multipart import encode_multipart

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
Answer = Callable[[str, str], Iterable[bytes]]


@contextlib.contextmanager
def answering(answer: Answer) -> Iterator[str]:
    """A loopback server that writes ``answer(method, path)`` as the raw HTTP answer to
    every request, then hangs up."""

    class Handler(StandIn):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            self.read_body()
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client hung up: it refused the answer
                for piece in answer(self.command, self.path):
                    self.wfile.write(piece)
                self.wfile.flush()

        do_GET = do_POST = _answer

    with serving(Handler) as url:
        yield url


def head(status: int = 200, **headers: object) -> bytes:
    """A status line and headers (``Content_Type`` is sent as ``Content-Type``)."""
    lines = [f"HTTP/1.1 {status} X"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def whole(body: bytes, content_type: str = "application/json", **headers: object) -> Answer:
    return lambda method, path: [
        head(Content_Type=content_type, Content_Length=len(body), **headers) + body
    ]


def program() -> Program:
    built = Program()
    built.return_(key="k", value=built.upload(kind="bytes", value=b"k", id="k"))
    return built


def completed(results: dict[str, Any], parts: list[bytes]) -> tuple[str, bytes]:
    """A ``COMPLETED`` answer with hand-made result nodes and their parts."""
    document = json.dumps(
        {
            "status": "COMPLETED",
            "request_id": str(uuid.uuid4()),
            **dict.fromkeys(("queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"), 0.0),
            "results": results,
            "stdout": "",
            "stderr": "",
        }
    ).encode()
    content_type, chunks, _ = encode_multipart(
        [("result", "application/json", document)]
        + [(f"return:{i}", "application/octet-stream", part) for i, part in enumerate(parts)]
    )
    return content_type, b"".join(bytes(chunk) for chunk in chunks)


# -------------------------------------------------------------------- encoded answers


def gzip_bomb(size: int) -> bytes:
    """``size`` zero bytes, gzipped twice: a few hundred bytes on the wire."""
    return gzip.compress(gzip.compress(bytes(size), 9), 9)


@pytest.mark.parametrize("encoding", ["gzip", "gzip, gzip", "deflate", "br", "x-unknown"])
def test_an_encoded_answer_the_client_never_asked_for_is_refused_uninflated(
    encoding: str,
) -> None:
    bomb = gzip_bomb(64 * MIB)
    with answering(whole(bomb, Content_Encoding=encoding)) as url, Client(url) as client:
        tracemalloc.start()
        try:
            with pytest.raises(ProtocolError, match="Content-Encoding") as raised:
                client.health()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "accepts only identity" in str(raised.value)
    assert peak < 8 * MIB, f"{peak} bytes traced: the body was inflated"


def test_a_large_encoded_answer_is_refused_before_its_body_is_read() -> None:
    """Over 1 MiB the body is read straight into a buffer; the refusal comes first."""
    body = gzip.compress(bytes(2 * MIB)) + bytes(2 * MIB)
    with answering(whole(body, Content_Encoding="gzip")) as url:
        with pytest.raises(ProtocolError, match="Content-Encoding 'gzip'"):
            HttpTransport(url, headers={}, connect_timeout_seconds=5).request("GET", "/")


def test_an_encoded_error_answer_is_refused_too() -> None:
    body = gzip.compress(b'{"error": {"kind": "parse", "message": "no"}}')
    with answering(
        lambda m, p: [head(500, Content_Encoding="gzip", Content_Length=len(body)) + body]
    ) as url:
        with Client(url) as client, pytest.raises(ProtocolError, match="Content-Encoding"):
            client.health()


def test_an_encoded_event_stream_is_refused_uninflated() -> None:
    bomb = gzip_bomb(64 * MIB)
    stream = head(Content_Type="text/event-stream", Content_Encoding="gzip, gzip") + bomb
    with answering(lambda m, p: [stream]) as url, Client(url) as client:
        with pytest.raises(ProtocolError, match="Content-Encoding"):
            list(client.job("j1").events())


# ------------------------------------------------------------- declared Content-Length


def declared(length: int, sent: int) -> Answer:
    """An answer that declares ``length`` body bytes, sends ``sent`` of them and hangs up."""
    return lambda method, path: [
        head(Content_Type="application/json", Content_Length=length),
        *(bytes(MIB) for _ in range(sent // MIB)),
        bytes(sent % MIB),
    ]


def traced_peak(call: Callable[[], object]) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        try:
            call()
        except Exception as exc:
            raised: BaseException | None = exc
        else:
            raised = None
        return raised, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_huge_declared_length_is_a_transport_error_not_a_memory_error() -> None:
    """10**15 bytes declared, 2 MiB sent: more than the client reads, refused before its
    body (EXTENSIONS §17; a bare ``MemoryError`` before the first buffer was bounded)."""
    with answering(declared(10**15, 2 * MIB + 7)) as url, Client(url) as client:
        raised, peak = traced_peak(client.health)
    assert isinstance(raised, TransportError), raised
    assert "answered, but its answer is 909.5 TiB, more than the " in str(raised)
    assert peak < client_http.FIRST_BUFFER_BYTES + 16 * MIB


def test_memory_follows_the_bytes_received_not_the_declared_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a 1 MiB first buffer, 3 MiB received of 512 MiB declared hold about 4 MiB."""
    monkeypatch.setattr(client_http, "FIRST_BUFFER_BYTES", MIB)
    with answering(declared(512 * MIB, 3 * MIB + 100)) as url:
        transport = HttpTransport(url, headers={}, connect_timeout_seconds=5)
        raised, peak = traced_peak(lambda: transport.request("GET", "/"))
    assert isinstance(raised, TransportError), raised
    assert f"({3 * MIB + 100} of {512 * MIB} bytes came)" in str(raised)
    assert peak < 12 * MIB, f"{peak} bytes traced for 3 MiB received"


def test_an_honest_answer_larger_than_the_first_buffer_arrives_whole_and_is_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_http, "FIRST_BUFFER_BYTES", MIB)
    body = hashlib.sha256(b"seed").digest() * (5 * MIB // 32) + b"tail"
    with answering(whole(body, "application/octet-stream")) as url:
        transport = HttpTransport(url, headers={}, connect_timeout_seconds=5)
        first = transport.request("GET", "/")
        assert isinstance(first.data, memoryview) and first.data == body
        underlying = first.data.obj
        del first
        second = transport.request("GET", "/")
        assert second.data == body
        assert second.data.obj is underlying  # grown once, then kept and reused


def test_an_answer_that_does_not_fit_in_memory_is_a_transport_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_memory(buffer: bytearray, size: int) -> None:
        raise MemoryError

    monkeypatch.setattr(client_http, "FIRST_BUFFER_BYTES", MIB)
    monkeypatch.setattr(client_http, "grow", no_memory)
    with answering(whole(bytes(3 * MIB), "application/octet-stream")) as url:
        transport = HttpTransport(url, headers={}, connect_timeout_seconds=5)
        with pytest.raises(TransportError, match="does not fit in memory"):
            transport.request("GET", "/")


# ---------------------------------------------------------------------- event streams


def event_stream_of(*pieces: bytes, release: threading.Event | None = None) -> Answer:
    """An event stream of ``pieces``; with ``release``, it then waits (at most 20 s) before
    its ``finished`` event: a client that waits for a line's end waits that long."""

    def answer(method: str, path: str) -> Iterator[bytes]:
        yield head(Content_Type="text/event-stream")
        yield from pieces
        if release is not None:
            release.wait(20)
        yield b'id: 99\nevent: phase\ndata: {"phase": "finished"}\n\n'

    return answer


def events_from(answer: Answer) -> list[Any]:
    with answering(answer) as url, Client(url) as client:
        return list(client.job("j1").events())


def test_an_event_id_of_thousands_of_digits_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="id of 5000 digits"):
        events_from(event_stream_of(b"id: " + b"9" * 5000 + b"\nevent: phase\ndata: {}\n\n"))


def test_a_line_without_an_end_is_refused_once_over_its_cap_without_waiting_for_more() -> None:
    release = threading.Event()
    try:
        endless = event_stream_of(b":" + b"x" * (2 * MIB), release=release)
        with pytest.raises(ProtocolError, match=f"line over {event_stream.MAX_LINE_BYTES}"):
            events_from(endless)
        assert not release.is_set()  # refused before the server went on
    finally:
        release.set()


def test_an_event_with_too_many_data_lines_is_a_protocol_error() -> None:
    lines = b"data: 1\n" * (event_stream.MAX_EVENT_DATA_LINES + 1)
    with pytest.raises(ProtocolError, match="data lines"):
        events_from(event_stream_of(b"id: 1\nevent: stdout\n" + lines + b"\n"))


def test_a_data_line_over_the_event_data_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_stream, "MAX_EVENT_DATA_BYTES", 2 * MIB)
    release = threading.Event()
    try:
        data = b'data: {"text": "' + b"y" * (3 * MIB)
        with pytest.raises(ProtocolError, match="data over"):
            events_from(event_stream_of(b"id: 1\nevent: stdout\n", data, release=release))
    finally:
        release.set()


def test_a_long_data_line_and_many_short_lines_still_parse() -> None:
    """What an honest server may send: a data line over the line cap (a large output), after
    many comment lines."""
    text = "z" * (3 * MIB)
    events = events_from(
        event_stream_of(
            b":\n" * 100_000,
            b"id: 1\nevent: stdout\ndata: " + json.dumps({"text": text}).encode() + b"\n\n",
        )
    )
    assert [event.id for event in events] == [1, 99]
    assert events[0].text == text


# ------------------------------------------------------------------- decoded documents


def test_a_deeply_nested_info_document_is_a_protocol_error() -> None:
    nested = b"[" * 700 + b"]" * 700
    body = b'{"kcoral": "0.0", "x": ' + nested + b"}"
    with answering(whole(body)) as url, Client(url) as client:
        with pytest.raises(ProtocolError, match="nested over 64 levels"):
            client.info()


@pytest.mark.parametrize(
    ("shape", "part"),
    [
        ([1] * 65, b"\0"),  # more dimensions than NumPy has
        ([0, 2**63], b""),  # empty, but a dimension beyond intp
        ([0, 2**70], b""),
        ([2**62, 0, 2**62], b""),  # empty, but its non-zero dimensions overflow
    ],
)
def test_a_tensor_shape_numpy_cannot_hold_is_a_protocol_error(
    shape: list[int], part: bytes
) -> None:
    node = {
        "type": "tensor",
        "dtype": "uint8",
        "shape": shape,
        "part": "return:0",
        "sha256": hashlib.sha256(part).hexdigest(),
    }
    content_type, body = completed({"t": node}, [part])
    with answering(whole(body, content_type)) as url, Client(url) as client:
        with pytest.raises(ProtocolError, match="beyond NumPy's limits"):
            client.execute(program())
