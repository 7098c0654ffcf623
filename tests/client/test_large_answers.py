"""Large answers: read into one reused buffer, parts hashed while they are copied out."""

from __future__ import annotations

import hashlib
import http.server
import json
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pytest
from stand_in_http import serving

from kcoral.connection.http import HttpTransport
from kcoral.errors import ProtocolError, TransportError
from kcoral.protocol.multipart import encode_multipart
from kcoral.response import decode_execute_response

MIB = 1 << 20


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    payloads: ClassVar[list[bytes]] = []
    short_by = 0

    def do_GET(self) -> None:
        data = self.payloads.pop(0)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data) + self.short_by))
        self.end_headers()
        self.wfile.write(data)
        if self.short_by:
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[type[_Handler]]:
    handler = type("Handler", (_Handler,), {"payloads": [], "short_by": 0})
    with serving(handler) as url:
        handler.url = url  # type: ignore[attr-defined]
        yield handler


def transport(url: str) -> HttpTransport:
    return HttpTransport(url, headers={}, connect_timeout_seconds=5)


def test_a_small_answer_is_bytes_and_a_large_one_a_view_with_the_same_content(server) -> None:
    small, large = b"x" * 100, bytes(range(256)) * (6 * 4096)
    server.payloads += [small, large]
    client = transport(server.url)
    first = client.request("GET", "/")
    second = client.request("GET", "/")
    assert isinstance(first.data, bytes) and first.data == small
    assert isinstance(second.data, memoryview) and second.data == large


def test_a_buffer_still_referenced_is_never_reused(server) -> None:
    one, two, three = (bytes([n]) * (2 * MIB) for n in (1, 2, 3))
    server.payloads += [one, two, three]
    client = transport(server.url)
    first = client.request("GET", "/")
    second = client.request("GET", "/")
    assert first.data == one and second.data == two  # the first was not overwritten
    kept = second.data.obj
    del first, second
    third = client.request("GET", "/")
    assert third.data == three
    assert third.data.obj is kept  # nothing referenced it any more: reused


def test_a_large_answer_cut_short_is_a_transport_error(server) -> None:
    server.payloads.append(b"y" * (2 * MIB))
    server.short_by = 10
    with pytest.raises(TransportError):
        transport(server.url).request("GET", "/")


def multipart_answer(node: dict, part: bytes) -> tuple[str, memoryview]:
    result = {
        "status": "COMPLETED",
        "request_id": "r",
        "queue_ms": 0,
        "elapsed_ms": 0,
        "lease_wait_ms": 0,
        "lease_held_ms": 0,
        "stdout": "",
        "stderr": "",
        "results": {"v": node},
    }
    content_type, chunks, _ = encode_multipart(
        [
            ("result", "application/json", json.dumps(result).encode()),
            ("return:0", "application/octet-stream", part),
        ]
    )
    return content_type, memoryview(b"".join(bytes(c) for c in chunks))


@pytest.mark.parametrize("size", [100, 2 * MIB])
def test_a_bytes_part_is_verified_whatever_its_size(size: int) -> None:
    data = np.random.default_rng(size).bytes(size)
    digest = hashlib.sha256(data).hexdigest()
    node = {"type": "bytes", "part": "return:0", "sha256": digest}
    result = decode_execute_response(*multipart_answer(node, data), ())
    assert result["v"] == data and isinstance(result["v"], bytes)
    node["sha256"] = "0" * 64
    with pytest.raises(ProtocolError, match="sha256"):
        decode_execute_response(*multipart_answer(node, data), ())


def test_a_large_tensor_part_is_checked_for_its_hash_before_its_length() -> None:
    array = np.arange(MIB // 2, dtype=np.float32)
    data = array.tobytes()
    node = {
        "type": "tensor",
        "dtype": "float32",
        "shape": [MIB // 2],
        "part": "return:0",
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    decoded = decode_execute_response(*multipart_answer(node, data), ())["v"]
    assert np.array_equal(decoded, array) and decoded.flags.writeable
    node["shape"] = [MIB // 2 + 1]
    with pytest.raises(ProtocolError, match="wrong length"):
        decode_execute_response(*multipart_answer(node, data), ())
    node["sha256"] = "0" * 64
    with pytest.raises(ProtocolError, match="sha256"):
        decode_execute_response(*multipart_answer(node, data), ())
