"""``GET /metrics`` says the exposition format its body is written in, ``text/plain;
version=0.0.4`` (EXTENSIONS §13), on a server and on a router, whatever prometheus-client
release is installed.

Before, the answer took the library's ``CONTENT_TYPE_LATEST``, which newer releases made
``version=1.0.0`` while ``generate_latest`` still wrote the same 0.0.4 text: what the header
declared changed with the installed library, not with the body.
"""

from __future__ import annotations

import sys
from pathlib import Path

from http_helpers import get
from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router

EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


def test_a_server_answers_metrics_as_0_0_4_text(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", ["--num-workers", "1"])
    try:
        response = get(server.url, "/metrics")
    finally:
        server.stop()
    assert response.status == 200
    assert response.headers["content-type"] == EXPOSITION
    assert b"# TYPE kcoral_requests_total counter" in response.raw


def test_a_router_answers_metrics_as_0_0_4_text(tmp_path: Path) -> None:
    router = start_router(tmp_path)
    try:
        response = get(router.url, "/metrics")
    finally:
        router.stop()
    assert response.status == 200
    assert response.headers["content-type"] == EXPOSITION
    assert b"# TYPE kcoral_router_requests_total counter" in response.raw
