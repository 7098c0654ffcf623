"""``GET /metrics`` carries no ``_created`` samples, on a server and on a router
(EXTENSIONS §13). prometheus-client writes one for every counter and histogram label set
by default; a router already dropped them from the node series it relays, while a server's
own exposition, and a router's, still had one for each."""

from __future__ import annotations

import sys
from pathlib import Path

from http_helpers import get, request
from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router


def _created_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "_created" in line]


def test_a_servers_metrics_have_no_created_samples(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", ["--num-workers", "1"])
    try:
        assert get(server.url, "/health").status == 200  # a labelled request duration
        text = get(server.url, "/metrics").raw.decode()
    finally:
        server.stop()
    assert 'kcoral_request_duration_seconds_count{endpoint="health"} 1.0' in text, text
    assert "kcoral_worker_starts_total" in text, text
    assert _created_lines(text) == []


def test_a_routers_metrics_have_no_created_samples(tmp_path: Path) -> None:
    router = start_router(tmp_path)
    try:
        # a malformed selector is refused before any wait for a node: a counted request
        refused = request(router.url, "POST", "/execute", b"{", {"X-KCoral-Select": "=bad"})
        assert refused.status == 400
        text = get(router.url, "/metrics").raw.decode()
    finally:
        router.stop()
    assert "kcoral_router_requests_total{" in text, text
    assert _created_lines(text) == []
