"""The status endpoints (PROTOCOL §12, EXTENSIONS §6): /health, /v1/info and
/internal/worker-status answers, conditional GETs, and 405 on a known path.

Moved from the conformance audit of the core against the specs (each test pins one
normative statement no other test did).
"""

from __future__ import annotations

import importlib.util
import re
import socket

import pytest
from e2e_support import (
    ERROR_FIELDS,
    request,
)
from server_process import start_server

import kcoral

# PROTOCOL §12: `started_at` is RFC 3339 UTC with `Z` (fractional seconds optional).
RFC3339_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
INFO_FIELDS = {
    "kcoral",
    "protocol",
    "features",
    "device",
    "sandbox",
    "optional",
    "sessions",
    "limits",
}


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
