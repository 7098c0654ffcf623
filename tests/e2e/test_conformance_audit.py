"""Conformance points of PROTOCOL.md / EXTENSIONS.md / CLIENT_API.md that no other test pins.

Each test covers one normative statement the rest of the suite left open (an audit of the
core against the specs; the two discrepancies it found, bodiless 304s for conditional GETs
and a job result's ``X-Request-ID``, are fixed).
"""

from __future__ import annotations

import http.client
import importlib.util
import re
import socket
import uuid
from typing import Any

import pytest
from e2e_support import (
    CACHE_MISS_FIELDS,
    ERROR_FIELDS,
    RESULT_FIELDS,
    execute_body,
    execute_raw,
    is_canonical_uuid,
    module_program,
    request,
    sha256,
    wait_for,
)
from server_process import start_server

import kcoral
from kcoral.protocol.strict_json import dumps_compact

# PROTOCOL §12: `started_at` is RFC 3339 UTC with `Z` (fractional seconds optional).
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
INFO_FIELDS = {"kcoral", "protocol", "features", "device", "sandbox", "optional", "limits"}
JOB_FIELDS = {
    "job_id",
    "request_id",
    "status",
    "submitted_at",
    "started_at",
    "finished_at",
    "worker_id",
    "gpu_ids",
    "target",
    "queue_position",
    "queue_ms",
    "lease_wait_ms",
    "lease_held_ms",
    "elapsed_ms",
    "error_kind",
}
FINISHED_JOB_STATUSES = {"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT", "ERROR"}
ONE = "def f():\n    return 1\n"


def module_upload(source: str) -> dict[str, Any]:
    return {"op": "upload", "kind": "module", "id": "m", "source": source}


def call_and_return(name: str, key: str = "out") -> list[dict[str, Any]]:
    return [
        {"op": "get_function", "id": name, "module": {"$ref": "m"}, "name": name},
        {"op": "run", "id": f"{name}_out", "fn": {"$ref": name}},
        {"op": "return", "key": key, "value": {"$ref": f"{name}_out"}},
    ]


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


def non_loopback_ipv4() -> str | None:
    """An address of this machine that is not loopback (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def divide(a, b):
    return a / b


# ---------------------------------------------------------------- /health, /v1/info, status


def test_health_started_at_is_rfc3339_utc_and_versions_follow_the_cpu_rules(e2e_server):
    response = request(e2e_server.url, "GET", "/health")
    assert response.headers["Content-Type"] == "application/json"
    body = response.body
    assert RFC3339_UTC.fullmatch(body["started_at"]), body["started_at"]
    versions = body["versions"]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in versions.items())
    # CPU servers: tvm_ffi when installed (PROTOCOL §12), torch when present (EXTENSIONS §2).
    assert set(versions) <= {"tvm_ffi", "torch"}
    assert ("torch" in versions) == (importlib.util.find_spec("torch") is not None)
    assert ("tvm_ffi" in versions) == (importlib.util.find_spec("tvm_ffi") is not None)
    status = request(e2e_server.url, "GET", "/internal/worker-status")
    assert status.headers["Content-Type"] == "application/json"
    assert status.body["instance_id"] == body["instance_id"]
    assert status.body["target"] == body["target"] and status.body["versions"] == versions


@pytest.mark.parametrize("path", ["/health", "/v1/info", "/internal/worker-status"])
def test_a_conditional_get_still_gets_200_and_the_full_body(e2e_server, path):
    # PROTOCOL §12: a direct server answers 200 whenever it can handle the request, with
    # the exact key set; "*" matches any entity tag, so this does not depend on the load.
    response = request(e2e_server.url, "GET", path, headers={"If-None-Match": "*"})
    assert response.status == 200
    assert isinstance(response.body, dict) and response.body


def test_info_has_exactly_the_extension_keys(e2e_server):
    response = request(e2e_server.url, "GET", "/v1/info")
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json"
    body = response.body
    assert set(body) == INFO_FIELDS
    assert body["kcoral"] == kcoral.__version__ and body["protocol"] == 1
    assert body["device"] == "cpu"
    assert len(body["features"]) == len(set(body["features"]))
    for name, value in body["limits"].items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool), name


def test_worker_status_is_404_for_a_non_loopback_peer_and_needs_no_token(tmp_path):
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    server = start_server(tmp_path, ["--host", "0.0.0.0"], env={"KCORAL_AUTH_TOKEN": "t0ken"})
    try:
        local = request(f"http://127.0.0.1:{server.port}", "GET", "/internal/worker-status")
        remote = request(f"http://{address}:{server.port}", "GET", "/internal/worker-status")
        health = request(f"http://{address}:{server.port}", "GET", "/health")
    finally:
        server.stop()
    assert local.status == 200 and local.body["status"] == "ok"
    assert remote.status == 404
    assert set(remote.body) == ERROR_FIELDS
    assert remote.header_values("X-Request-ID") == [remote.body["request_id"]]
    assert health.status == 200  # public from anywhere (EXTENSIONS §6)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/health", "GET"),
        ("POST", "/internal/worker-status", "GET"),
        ("POST", "/v1/info", "GET"),
        ("PUT", "/execute", "POST"),
        ("PUT", "/v1/jobs", "GET, POST"),
    ],
)
def test_another_method_on_a_known_path_is_405_with_allow_and_a_json_error(
    e2e_server, method, path, allow
):
    response = request(e2e_server.url, method, path, b"" if method in ("POST", "PUT") else None)
    assert response.status == 405
    assert response.headers["Allow"] == allow
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.body) == ERROR_FIELDS and response.body["status"] == "ERROR"
    assert set(response.body["error"]) == {"kind", "message"}


# ---------------------------------------------------------------- headers and check order


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


# ---------------------------------------------------------------- bodies and error objects


def test_response_json_is_compact_and_keeps_non_ascii_characters(e2e_server):
    source = "def f():\n    print('h\\u00e9llo \\u2713')\n    return '\\u00fcn\\u00ef \\u2713'\n"
    response = execute_raw(
        e2e_server.url, {"instructions": [module_upload(source), *call_and_return("f")]}
    )
    assert response.status == 200 and response.headers["Content-Type"] == "application/json"
    assert "ünï ✓".encode() in response.raw and "héllo ✓".encode() in response.raw
    assert b"\\u" not in response.raw
    assert b'", "' not in response.raw and b'": ' not in response.raw
    assert response.body["results"]["out"] == {"type": "string", "value": "ünï ✓"}


def test_a_traceback_longer_than_8192_characters_keeps_its_last_8192(e2e_server):
    source = "def f():\n    raise ValueError('x' * 20000 + 'END')\n"
    response = execute_raw(
        e2e_server.url, {"instructions": [module_upload(source), *call_and_return("f")]}
    )
    error = response.body["error"]
    assert error["message"] == "ValueError: " + "x" * 20000 + "END"  # messages are not cut
    assert len(error["traceback"]) == 8192
    assert error["traceback"].rstrip("\n").endswith("xxxEND")


def test_a_failed_file_upload_without_id_reports_a_null_instruction_id(e2e_server):
    data = b"q"
    source = "import os\nos.mkdir('d')\nopen('d/x', 'w').close()\n"
    document = {
        "instructions": [
            module_upload(source),
            {"op": "upload", "kind": "file", "path": "d/x", "blob": sha256(data)},
        ]
    }
    response = execute_raw(e2e_server.url, document, {sha256(data): data})
    assert response.body["status"] == "FAILED"
    error = response.body["error"]
    assert (error["kind"], error["instruction_index"]) == ("runtime", 1)
    assert error["instruction_op"] == "upload" and error["instruction_id"] is None


def test_a_failing_return_rolls_back_its_parts_and_keeps_numbering_contiguous(e2e_server):
    source = "def g():\n    return b'first'\ndef h():\n    return [b'rolled back', object()]\n"
    document = {
        "instructions": [
            module_upload(source),
            *call_and_return("g", "a"),
            *call_and_return("h", "b"),
        ]
    }
    response = execute_raw(e2e_server.url, document)
    assert response.status == 200 and response.body["status"] == "FAILED"
    assert response.body["error"]["kind"] == "serialization"
    assert response.body["results"] == {
        "a": {"type": "bytes", "part": "return:0", "sha256": sha256(b"first")}
    }
    assert response.part_order == ["result", "return:0"]
    assert response.parts == {"return:0": b"first"}


def test_a_value_return_snapshots_the_value_when_it_runs(e2e_server):
    source = "x = [1]\ndef get():\n    return x\ndef grow():\n    x.append(2)\n"
    document = {
        "instructions": [
            module_upload(source),
            {"op": "get_function", "id": "get", "module": {"$ref": "m"}, "name": "get"},
            {"op": "get_function", "id": "grow", "module": {"$ref": "m"}, "name": "grow"},
            {"op": "run", "id": "x", "fn": {"$ref": "get"}},
            {"op": "return", "key": "before", "value": {"$ref": "x"}},
            {"op": "run", "id": "grown", "fn": {"$ref": "grow"}},
            {"op": "return", "key": "after", "value": {"$ref": "x"}},
        ]
    }
    results = execute_raw(e2e_server.url, document).body["results"]
    assert list(results) == ["before", "after"]
    assert results["before"]["value"] == [{"type": "integer", "value": 1}]
    assert len(results["after"]["value"]) == 2


def test_an_empty_folder_return_alone_keeps_the_answer_plain_json(e2e_server):
    document = {
        "instructions": [
            module_upload("import os\nos.mkdir('empty')\n"),
            {"op": "return", "key": "f", "kind": "folder", "path": "empty"},
        ]
    }
    response = execute_raw(e2e_server.url, document)
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.body) == RESULT_FIELDS
    assert response.body["results"] == {"f": {"type": "folder", "files": {}, "directories": []}}


def test_get_function_on_a_bytes_handle_is_unavailable_on_a_cpu_server(e2e_server):
    data = b"not a module"
    document = {
        "instructions": [
            {"op": "upload", "kind": "bytes", "id": "b", "blob": sha256(data)},
            {"op": "get_function", "id": "f", "module": {"$ref": "b"}, "name": "f"},
        ]
    }
    error = execute_raw(e2e_server.url, document, {sha256(data): data}).body["error"]
    assert (error["kind"], error["instruction_op"], error["instruction_id"]) == (
        "unavailable",
        "get_function",
        "f",
    )


def test_remote_execution_error_names_the_request_kind_and_message(client):
    remote = client.function()(divide)
    with pytest.raises(kcoral.RemoteExecutionError) as caught:
        remote.remote(1, 0)
    result = caught.value.result
    assert result.status == "FAILED" and is_canonical_uuid(result.request_id)
    assert str(caught.value) == (
        f"Remote execution {result.request_id} failed: runtime: ZeroDivisionError: division by zero"
    )


# ---------------------------------------------------------------- jobs (EXTENSIONS §5)


def submit_raw(url: str, document: dict[str, Any]):
    content_type, body = execute_body(document)
    return request(url, "POST", "/v1/jobs", body, {"Content-Type": content_type})


def finished_job(url: str, job_id: str) -> dict[str, Any]:
    def state() -> dict[str, Any] | None:
        body = request(url, "GET", f"/v1/jobs/{job_id}").body
        return body if body["status"] in FINISHED_JOB_STATUSES else None

    return wait_for(state, what=f"job {job_id} to finish")


def test_job_answers_have_exactly_the_documented_fields(e2e_server):
    url = e2e_server.url
    submitted = submit_raw(url, {"instructions": [module_upload(ONE), *call_and_return("f")]})
    assert submitted.status == 202
    assert submitted.headers["Content-Type"] == "application/json"
    assert set(submitted.body) == {"job_id", "request_id", "status"}
    assert submitted.body["status"] == "QUEUED"
    assert is_canonical_uuid(submitted.body["job_id"])
    assert submitted.header_values("X-Request-ID") == [submitted.body["request_id"]]
    job_id = submitted.body["job_id"]
    state = finished_job(url, job_id)
    assert set(state) == JOB_FIELDS and state["status"] == "COMPLETED"
    assert state["request_id"] == submitted.body["request_id"]
    for name in ("submitted_at", "started_at", "finished_at"):
        assert RFC3339_UTC.fullmatch(state[name]), name
    listed = request(url, "GET", "/v1/jobs").body
    assert isinstance(listed, list) and all(set(item) == JOB_FIELDS for item in listed)
    assert job_id in [item["job_id"] for item in listed]
    result = request(url, "GET", f"/v1/jobs/{job_id}/result")
    assert result.status == 200 and set(result.body) == RESULT_FIELDS
    assert result.body["results"] == {"out": {"type": "integer", "value": 1}}


def test_a_job_result_carries_the_request_id_of_its_body_in_x_request_id(e2e_server):
    url = e2e_server.url
    submitted = submit_raw(url, {"instructions": [module_upload(ONE), *call_and_return("f")]})
    finished_job(url, submitted.body["job_id"])
    result = request(url, "GET", f"/v1/jobs/{submitted.body['job_id']}/result")
    assert result.body["request_id"] == submitted.body["request_id"]
    assert result.header_values("X-Request-ID") == [result.body["request_id"]]
