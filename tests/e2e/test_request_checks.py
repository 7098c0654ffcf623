"""The order and details of /execute checks (PROTOCOL §3.2, §8, EXTENSIONS §2, §6): size
before serialization before parsing, unreferenced blobs, gpu_count, cache kinds, timeout
clamping, and the X-KCoral-Node header on a direct server.

Moved from the conformance audit of the core against the specs (each test pins one
normative statement no other test did).
"""

from __future__ import annotations

import http.client
import uuid
from typing import Any

from e2e_support import (
    CACHE_MISS_FIELDS,
    ERROR_FIELDS,
    execute_body,
    execute_raw,
    module_program,
    request,
    sha256,
)

from kcoral.protocol.strict_json import dumps_compact

ONE = "def f():\n    return 1\n"


def raw_exchange(url: str, head: list[tuple[str, str]], path: str = "/execute") -> tuple:
    """Send only request headers (no body) and read the answer: refusals come first."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", path)
        for name, value in head:
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, answer.headers, answer.read()
    finally:
        conn.close()


def test_a_direct_server_ignores_x_kcoral_node_and_never_sets_it(e2e_server):
    program = module_program(ONE, "f")
    response = execute_raw(
        e2e_server.url,
        {"instructions": program.instructions},
        headers={"X-KCoral-Node": "node-a"},
    )
    assert response.status == 200 and response.body["status"] == "COMPLETED"
    assert response.header_values("X-KCoral-Node") == []


def test_the_size_limit_comes_before_the_serialization_check_and_that_before_parsing(e2e_server):
    status, headers, raw = raw_exchange(
        e2e_server.url,
        [
            ("Content-Type", "multipart/form-data; boundary=x"),
            ("Content-Length", str(10**12)),
            ("X-KCoral-Serialization", "yaml"),
        ],
    )
    assert status == 413 and b'"request_too_large"' in raw
    assert headers["X-Request-ID"] and headers.get("Retry-After") is None
    content_type, body = execute_body(b"this is not JSON")
    refused = request(
        e2e_server.url,
        "POST",
        "/execute",
        body,
        {"Content-Type": content_type, "X-KCoral-Serialization": "yaml"},
    )
    assert refused.status == 400 and refused.body["error"]["kind"] == "parse"
    assert "serialization" in refused.body["error"]["message"].lower()


def test_an_unreferenced_blob_part_is_a_400_even_when_other_blobs_are_missing(e2e_server):
    stray = b"stray-" + uuid.uuid4().bytes
    document = {
        "instructions": [
            {"op": "upload", "kind": "bytes", "id": "b", "blob": sha256(uuid.uuid4().bytes)}
        ]
    }
    response = execute_raw(e2e_server.url, document, {sha256(stray): stray})
    assert response.status == 400  # row 13 comes before row 15 (CACHE_MISS)
    assert set(response.body) == ERROR_FIELDS and response.body["error"]["kind"] == "parse"


def test_gpu_count_is_refused_only_once_the_blobs_resolve(e2e_server):
    data = b"gpu-count-" + uuid.uuid4().bytes
    document = {
        "instructions": [{"op": "upload", "kind": "bytes", "id": "b", "blob": sha256(data)}],
        "options": {"gpu_count": 1},
    }
    missing = execute_raw(e2e_server.url, document)
    assert missing.status == 200 and set(missing.body) == CACHE_MISS_FIELDS
    assert missing.body["missing_blobs"] == [sha256(data)]
    refused = execute_raw(e2e_server.url, document, {sha256(data): data})
    assert refused.status == 400 and refused.body["error"] == {
        "kind": "parse",
        "message": "gpu_count exceeds this GPU server's configured capacity",
    }


def test_a_cache_hit_counts_only_for_the_upload_kind_whose_cache_holds_it(e2e_server):
    in_memory = b"memory-" + uuid.uuid4().bytes
    on_disk = b"disk-" + uuid.uuid4().bytes

    def bytes_upload(data: bytes) -> dict[str, Any]:
        return {
            "instructions": [{"op": "upload", "kind": "bytes", "id": "b", "blob": sha256(data)}]
        }

    def file_upload(data: bytes) -> dict[str, Any]:
        return {
            "instructions": [{"op": "upload", "kind": "file", "path": "x", "blob": sha256(data)}]
        }

    url = e2e_server.url
    stored = execute_raw(url, bytes_upload(in_memory), {sha256(in_memory): in_memory})
    assert stored.body["status"] == "COMPLETED"
    assert execute_raw(url, file_upload(in_memory)).body["missing_blobs"] == [sha256(in_memory)]
    stored = execute_raw(url, file_upload(on_disk), {sha256(on_disk): on_disk})
    assert stored.body["status"] == "COMPLETED"
    assert execute_raw(url, bytes_upload(on_disk)).body["missing_blobs"] == [sha256(on_disk)]
    assert execute_raw(url, file_upload(on_disk)).body["status"] == "COMPLETED"


def test_an_integer_timeout_beyond_float_range_is_clamped_silently(e2e_server):
    program = module_program(ONE, "f")
    document = b'{"instructions":%s,"options":{"timeout_seconds":1%s}}' % (
        dumps_compact(program.instructions),
        b"0" * 400,
    )
    response = execute_raw(e2e_server.url, document)
    assert response.status == 200 and response.body["status"] == "COMPLETED"
