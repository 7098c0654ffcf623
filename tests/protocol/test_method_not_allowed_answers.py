"""PROTOCOL §2: a known path asked with another method is 405 with an ``Allow`` header, its
body an ``ERROR`` of kind ``method_not_allowed`` (§7.4), "from the server and the router
alike". A real router on loopback (it needs no node for this): its ``/health`` and any
method Tornado does not know answered Tornado's HTML page without ``Allow``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from raw_http import request
from router_helpers import RouterProcess, start_router

TOKEN = "client-t0ken-for-405-tests"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    directory = tmp_path_factory.mktemp("router-405")
    tokens = directory / "tokens"
    tokens.write_text(TOKEN + "\n")
    tokens.chmod(0o600)
    running = start_router(
        directory, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": "n0de-t0ken"}
    )
    yield running
    running.stop()


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/health", "GET"),
        ("DELETE", "/health", "GET"),
        ("FOO", "/health", "GET"),
        ("FOO", "/execute", "POST"),
        ("FOO", "/v1/info", "GET"),
    ],
)
def test_a_router_answers_another_method_with_allow_and_an_error_body(
    router: RouterProcess, method: str, path: str, allow: str
) -> None:
    answer = request(router.url, method, path, b"", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status == 405
    assert answer.header_values("Allow") == [allow]
    assert answer.headers.get("Content-Type") == "application/json"
    assert answer.body["status"] == "ERROR"
    assert set(answer.body) == {"status", "request_id", "error"}
    assert answer.body["error"] == {"kind": "method_not_allowed", "message": "method not allowed"}
    assert answer.header_values("X-Request-ID") == [answer.body["request_id"]]
