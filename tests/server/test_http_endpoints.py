"""The HTTP surface of a real server: endpoints, refusals and request ids."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import uuid

import pytest
from http_helpers import execute, execute_body, get, request
from server_process import start_server

MAX_REQUEST = 65536
HEALTH_KEYS = {"status", "instance_id", "started_at", "gpu_count", "load", "target", "versions"}
LOAD_KEYS = {"request_capacity", "requests_in_progress", "requests_waiting"}
SIMPLE = {"instructions": [{"op": "upload", "id": "m", "kind": "module", "source": "x = 1\n"}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = start_server(
        tmp_path_factory.mktemp("endpoints"),
        ["--num-workers", "2", "--max-request-bytes", str(MAX_REQUEST)],
    )
    yield running
    running.stop()


def test_health_has_exactly_the_documented_keys(server) -> None:
    response = get(server.url, "/health")
    assert response.status == 200
    body = response.body
    assert set(body) == HEALTH_KEYS and set(body["load"]) == LOAD_KEYS
    assert body["status"] == "ok" and body["gpu_count"] == 0 and body["target"] == {}
    assert str(uuid.UUID(body["instance_id"])) == body["instance_id"]
    assert body["started_at"].endswith("Z")
    assert body["load"] == {"request_capacity": 2, "requests_in_progress": 0, "requests_waiting": 0}
    assert all(isinstance(v, str) for v in body["versions"].values())


def test_info_lists_features_device_and_limits(server) -> None:
    body = get(server.url, "/v1/info").body
    assert body["protocol"] == 1 and body["device"] == "cpu"
    assert set(body["features"]) == {
        "cpu-tensors",
        "async-run",
        "serialization",
        "jobs",
        "sessions",
        "cancel-unfollowed",
        "output-order",
    }
    assert body["limits"]["max_request_bytes"] == MAX_REQUEST
    assert set(body["limits"]) == {
        "max_request_bytes",
        "max_response_bytes",
        "max_timeout_seconds",
        "max_output_limit_bytes",
    }


def test_worker_status_answers_loopback_peers(server) -> None:
    body = get(server.url, "/internal/worker-status").body
    assert set(body) == {
        "status",
        "instance_id",
        "target",
        "versions",
        "worker_count",
        "busy_workers",
        "cache_descriptors",
        "session_seat_count",
        "session_seats",  # a server without tokens: every caller is its one identity
        "draining",  # false until SIGTERM (PROTOCOL §13)
    }
    assert body["worker_count"] == 2 and body["busy_workers"] == 0
    assert body["draining"] is False


def test_an_unknown_path_is_a_json_404(server) -> None:
    response = get(server.url, "/nope")
    assert response.status == 404
    assert response.body["status"] == "ERROR"


@pytest.mark.parametrize(
    ("method", "path", "allow"), [("POST", "/health", "GET"), ("GET", "/execute", "POST")]
)
def test_a_wrong_method_is_405_with_allow(server, method: str, path: str, allow: str) -> None:
    response = request(server.url, method, path, b"" if method == "POST" else None)
    assert response.status == 405
    assert response.headers["Allow"] == allow
    assert response.body["status"] == "ERROR"


def test_a_declared_oversized_body_is_refused_before_it_is_sent(server) -> None:
    host, port = server.url.split("://")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/execute")
    conn.putheader("Content-Type", "multipart/form-data; boundary=x")
    conn.putheader("Content-Length", str(10**12))
    conn.endheaders()
    answer = conn.getresponse()
    body = json.loads(answer.read())
    conn.close()
    assert answer.status == 413
    assert set(body) == {"status", "request_id", "error"}
    assert body["error"] == {
        "kind": "request_too_large",
        "message": (
            f"request exceeds the configured size limit: {10**12} bytes, limit {MAX_REQUEST} "
            "bytes (max_request_bytes; kcoral server --max-request-bytes)"
        ),
    }
    assert answer.headers["X-Request-ID"] == body["request_id"]


def test_a_chunked_body_growing_past_the_limit_is_413(server) -> None:
    host, port = server.url.split("://")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    chunk = b"x" * 16384

    def chunks():
        for _ in range(8):  # 128 KiB > 64 KiB
            yield chunk

    try:
        conn.request(
            "POST",
            "/execute",
            body=chunks(),
            headers={"Content-Type": "multipart/form-data; boundary=x"},
            encode_chunked=True,
        )
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before the client finished sending
    answer = conn.getresponse()
    body = json.loads(answer.read())
    conn.close()
    assert answer.status == 413
    assert body["error"]["kind"] == "request_too_large"
    assert body["error"]["message"] == (
        f"request exceeds the configured size limit: over the limit of {MAX_REQUEST} bytes "
        "(max_request_bytes; kcoral server --max-request-bytes)"
    )


def test_a_canonical_request_id_is_echoed(server) -> None:
    rid = str(uuid.uuid4())
    response = execute(server.url, SIMPLE, headers={"X-Request-ID": rid})
    assert response.status == 200
    assert response.headers["X-Request-ID"] == rid == response.body["request_id"]


@pytest.mark.parametrize(
    "values",
    [["not-a-uuid"], [str(uuid.uuid4()).upper()], [str(uuid.uuid4()), str(uuid.uuid4())]],
)
def test_a_non_canonical_or_repeated_request_id_is_replaced(server, values: list[str]) -> None:
    content_type, body = execute_body(SIMPLE)
    headers = [("Content-Type", content_type)] + [("X-Request-ID", v) for v in values]
    response = request(server.url, "POST", "/execute", body, headers)
    rid = response.headers["X-Request-ID"]
    assert rid not in values and str(uuid.UUID(rid)) == rid
    assert response.body["request_id"] == rid


def test_a_bad_content_type_is_a_parse_error_with_exact_fields(server) -> None:
    response = request(server.url, "POST", "/execute", b"{}", {"Content-Type": "application/json"})
    assert response.status == 400
    assert set(response.body) == {"status", "request_id", "error"}
    assert response.body["error"]["kind"] == "parse"
    assert response.headers["X-Request-ID"] == response.body["request_id"]


def test_a_program_schema_error_is_a_400(server) -> None:
    bad = {"instructions": [{"op": "run", "id": "y", "fn": {"$ref": "missing"}}]}
    response = execute(server.url, bad)
    assert response.status == 400 and response.body["error"]["kind"] == "parse"


def test_gpu_count_on_a_cpu_server_is_a_400(server) -> None:
    program = {**SIMPLE, "options": {"gpu_count": 1}}
    response = execute(server.url, program)
    assert response.status == 400
    assert response.body["error"]["message"] == (
        "gpu_count exceeds this GPU server's configured capacity"
    )


def test_a_disallowed_serialization_format_is_refused(tmp_path) -> None:
    running = start_server(tmp_path, env={"KCORAL_ALLOWED_SERIALIZATION": "json"})
    try:
        response = execute(running.url, SIMPLE, headers={"X-KCoral-Serialization": "pickle"})
    finally:
        running.stop()
    assert response.status == 400
    assert response.body["error"]["message"] == (
        "Serialization format 'pickle' not allowed. Allowed formats: ['json']"
    )


def test_a_token_protects_everything_but_health(tmp_path) -> None:
    running = start_server(tmp_path, env={"KCORAL_AUTH_TOKEN": "s3cret"})
    try:
        refused = execute(running.url, SIMPLE)
        wrong = execute(running.url, SIMPLE, headers={"Authorization": "Bearer nope"})
        health = get(running.url, "/health")
        info_refused = get(running.url, "/v1/info")
        info = get(running.url, "/v1/info", {"Authorization": "Bearer s3cret"})
        allowed = execute(running.url, SIMPLE, headers={"Authorization": "Bearer s3cret"})
        events = running.events()
    finally:
        running.stop()
    assert refused.status == wrong.status == info_refused.status == 401
    assert refused.body["error"]["kind"] == "unauthorized"
    assert "s3cret" not in refused.raw.decode()
    assert health.status == 200 and allowed.status == 200
    assert "auth" in info.body["features"]
    assert not any("s3cret" in json.dumps(e) for e in events)
    refused_events = [e for e in events if e.get("request_id") == refused.body["request_id"]]
    assert [e["event"] for e in refused_events] == ["request_finished"]


def test_a_non_loopback_bind_without_a_token_refuses_to_start(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="without a client token"):
        start_server(tmp_path, ["--host", "0.0.0.0"])


@pytest.mark.skipif(shutil.which("bwrap") is not None, reason="bwrap is installed here")
def test_an_unusable_bubblewrap_sandbox_falls_back_to_none_with_a_warning(tmp_path) -> None:
    # issue 16: only --sandbox auto (the default) falls back; explicit bubblewrap refuses
    running = start_server(tmp_path, ["--sandbox", "auto"])
    try:
        health = get(running.url, "/health")
        events = running.events()
    finally:
        running.stop()
    assert health.status == 200
    disabled = [e for e in events if e["event"] == "sandbox_disabled"]
    assert len(disabled) == 1 and disabled[0]["level"] == "WARNING"
    assert disabled[0]["sandbox"] == "auto"
    ready = next(e for e in events if e["event"] == "pool_ready")
    assert ready["sandbox"] == "none" and ready["mode"] == "cpu"


def test_a_taken_port_is_refused_before_any_worker_starts(tmp_path) -> None:
    # Before, every worker started, "Application startup complete." was printed, and only
    # then did the listen fail (seconds later on a GPU server, whose workers start CUDA).
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--sandbox", "none",
             "--port", str(port), "--log-dir", str(tmp_path / "logs"), "--disk-cache-dir", ""],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        held.close()
    assert done.returncode == 1, done.stderr
    said = done.stderr.strip().splitlines()
    assert said[-1].startswith(f"kcoral server: cannot listen on 127.0.0.1:{port}: "), said
    assert "Application startup complete." not in done.stderr
    [run] = (tmp_path / "logs" / "runs").iterdir()
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert events == ["server_started", "server_start_failed"], events
