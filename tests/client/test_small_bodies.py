"""A small request body goes out in one send, a large one as given (``HttpTransport``,
against a real HTTP server on loopback): urllib3 sends each piece of a body with its own
``sendall``, and every extra send can wake the server once more."""

from __future__ import annotations

import pytest
import urllib3.connection
from stand_in_http import StandIn, serving

from kcoral.connection.http import SMALL_BODY_BYTES, HttpTransport
from kcoral.connection.transport import Request


class _Echo(StandIn):
    """Answers every POST with the body it received."""

    def do_POST(self) -> None:
        body = self.read_body()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every ``send`` of the client's connections (the headers' included)."""
    sizes: list[int] = []
    original = urllib3.connection.HTTPConnection.send

    def recording(self: urllib3.connection.HTTPConnection, data: bytes) -> None:
        sizes.append(len(data))
        original(self, data)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "send", recording)
    return sizes


def _post(url: str, chunks: list[bytes]) -> bytes:
    transport = HttpTransport(url, headers={}, connect_timeout_seconds=10)
    try:
        request = Request("POST", "/", chunks=chunks, length=sum(map(len, chunks)))
        return bytes(transport.handle_request(request).data)
    finally:
        transport.close()


def test_a_small_body_in_three_pieces_goes_out_in_one_send_after_the_headers(sends):
    pieces = [b"--boundary\r\n", b"x" * 1000, b"\r\n--boundary--\r\n"]
    with serving(_Echo) as url:
        assert _post(url, pieces) == b"".join(pieces)
    assert len(sends) == 2  # the headers, then the whole body
    assert sends[1] == sum(map(len, pieces))


def test_a_large_body_goes_out_as_given_without_being_joined(sends):
    pieces = [b"a" * SMALL_BODY_BYTES, b"b" * 10]
    with serving(_Echo) as url:
        assert _post(url, pieces) == b"".join(pieces)
    assert sends[1:] == [SMALL_BODY_BYTES, 10]
