"""Request-level rejections of PROTOCOL §3.2 as a client meets them."""

from __future__ import annotations

import math

import pytest
from e2e_support import ERROR_FIELDS, execute_body, execute_raw, module_program, request, sha256

import kcoral

PROGRAM = b'{"instructions":[{"op":"upload","kind":"bytes","id":"b","blob":"%s"}]}'
DATA = b"some blob bytes"
KEY = sha256(DATA)
CRLF = b"\r\n"


def part(name: bytes, ctype: bytes, data: bytes, extra: bytes = b"") -> bytes:
    return (
        b"--B\r\nContent-Disposition: form-data; name=\"" + name + b"\"\r\n"
        + extra + b"Content-Type: " + ctype + b"\r\n\r\n" + data + CRLF
    )  # fmt: skip


GOOD_PROGRAM = part(b"program", b"application/json", PROGRAM % KEY.encode())
GOOD_BLOB = part(b"blob:" + KEY.encode(), b"application/octet-stream", DATA)
END = b"--B--\r\n"

RAW_ROWS = {
    "row 2 content type": (b"text/plain", GOOD_PROGRAM + END),
    "row 2 no boundary": (b"multipart/form-data", GOOD_PROGRAM + END),
    "row 3 no closing delimiter": (None, GOOD_PROGRAM),
    "row 3 two dispositions": (
        None,
        part(
            b"program", b"application/json", b"{}", b'Content-Disposition: form-data; name="x"\r\n'
        )
        + END,
    ),
    "row 3 bad transfer encoding": (
        None,
        part(b"program", b"application/json", b"{}", b"Content-Transfer-Encoding: base64\r\n")
        + END,
    ),
    "row 3 zero parts": (None, END),
    "row 4 unknown part name": (
        None,
        GOOD_PROGRAM + part(b"extra", b"application/json", b"{}") + END,
    ),
    "row 4 upper-case hash": (
        None,
        GOOD_PROGRAM
        + part(b"blob:" + KEY.upper().encode(), b"application/octet-stream", DATA)
        + END,
    ),
    "row 5 no program": (None, GOOD_BLOB + END),
    "row 5 two programs": (None, GOOD_PROGRAM + GOOD_PROGRAM + END),
    "row 6 program type": (None, part(b"program", b"text/plain", PROGRAM % KEY.encode()) + END),
    "row 7 blob type": (
        None,
        GOOD_PROGRAM + part(b"blob:" + KEY.encode(), b"application/json", DATA) + END,
    ),
    "row 8 repeated blob": (None, GOOD_PROGRAM + GOOD_BLOB + GOOD_BLOB + END),
    "row 9 wrong hash": (
        None,
        GOOD_PROGRAM + part(b"blob:" + KEY.encode(), b"application/octet-stream", b"other") + END,
    ),
    "row 10 duplicate key": (
        None,
        part(b"program", b"application/json", b'{"instructions":[],"instructions":[]}') + END,
    ),
    "row 10 NaN": (
        None,
        part(
            b"program",
            b"application/json",
            b'{"instructions":[],"options":{"timeout_seconds":NaN}}',
        )
        + END,
    ),
    "row 10 invalid utf-8": (None, part(b"program", b"application/json", b'{"\xff":1}') + END),
    "row 10 top level array": (None, part(b"program", b"application/json", b"[]") + END),
    "row 11 unknown op": (
        None,
        part(b"program", b"application/json", b'{"instructions":[{"op":"jump"}]}') + END,
    ),
    "row 11 forward reference": (
        None,
        part(
            b"program",
            b"application/json",
            b'{"instructions":[{"op":"return","key":"k","value":{"$ref":"later"}},'
            b'{"op":"upload","kind":"module","id":"later","source":""}]}',
        )
        + END,
    ),
    "row 13 unreferenced blob": (
        None,
        part(
            b"program",
            b"application/json",
            b'{"instructions":[{"op":"upload","kind":"module","id":"m","source":""}]}',
        )
        + GOOD_BLOB
        + END,
    ),
}


@pytest.mark.parametrize("row", list(RAW_ROWS))
def test_malformed_requests_are_400_parse_with_an_exact_error_body(e2e_server, row):
    content_type, body = RAW_ROWS[row]
    response = request(
        e2e_server.url,
        "POST",
        "/execute",
        body,
        {"Content-Type": (content_type or b"multipart/form-data; boundary=B").decode()},
    )
    assert response.status == 400, response.body
    assert set(response.body) == ERROR_FIELDS
    assert response.body["error"]["kind"] == "parse"
    assert response.header_values("X-Request-ID") == [response.body["request_id"]]


def test_a_tensor_whose_cached_bytes_have_the_wrong_length_is_400_row_14(e2e_server):
    data = b"twelve bytes"
    document = {
        "instructions": [
            {
                "op": "upload",
                "kind": "tensor",
                "id": "t",
                "dtype": "float32",
                "shape": [4],
                "blob": sha256(data),
            }
        ]
    }
    response = execute_raw(e2e_server.url, document, {sha256(data): data})
    assert response.status == 400 and response.body["error"]["kind"] == "parse"


def test_rejections_the_client_can_reach_raise_kcoral_error_with_kind_parse(client):
    program = module_program("def f():\n    return 1\n", "f")
    for options in (
        {"timeout_seconds": 0},
        {"timeout_seconds": -1.5},
        {"output_limit_bytes": -1},
        {"gpu_count": 1},  # row 12: gpu_count on a CPU server
    ):
        with pytest.raises(kcoral.KCoralError) as caught:
            client.execute(program, **options)
        assert (caught.value.status_code, caught.value.kind) == (400, "parse"), options
        assert caught.value.message
    with pytest.raises(ValueError):
        client.execute(program, timeout_seconds=math.inf)  # never reaches the wire
    with pytest.raises(ValueError):
        client.execute(program, gpu_count=9)


def test_over_maximum_options_are_clamped_silently(client):
    program = module_program("def f():\n    return 1\n", "f")
    result = client.execute(program, timeout_seconds=10**9, output_limit_bytes=10**12)
    assert result["out"] == 1


def test_unknown_paths_are_404_and_wrong_methods_405_with_allow(e2e_server):
    assert request(e2e_server.url, "GET", "/nope").status == 404
    wrong = request(e2e_server.url, "GET", "/execute")
    assert wrong.status == 405 and "POST" in wrong.headers.get("Allow", "")
    wrong = request(e2e_server.url, "POST", "/health", b"")
    assert wrong.status == 405 and "GET" in wrong.headers.get("Allow", "")


def test_health_has_exactly_the_protocol_keys(client):
    status = client.health()
    assert set(status) == {
        "status", "instance_id", "started_at", "gpu_count", "load", "target", "versions",
    }  # fmt: skip
    assert set(status["load"]) == {"request_capacity", "requests_in_progress", "requests_waiting"}
    assert status["started_at"].endswith("Z") and status["gpu_count"] == 0
    with pytest.raises(kcoral.ProtocolError):
        client.target()  # CPU servers have no arch


def test_an_execute_body_built_by_the_helper_is_accepted(e2e_server):
    content_type, body = execute_body(
        {"instructions": [{"op": "upload", "kind": "module", "id": "m", "source": ""}]}
    )
    response = request(e2e_server.url, "POST", "/execute", body, {"Content-Type": content_type})
    assert response.status == 200 and response.body["status"] == "COMPLETED"
