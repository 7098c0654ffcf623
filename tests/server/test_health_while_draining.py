"""``GET /health`` of a draining server (SERVER §12): ``unavailable`` with 503, the body of
the same keys, so that a load balancer or a router's health check takes it out of rotation
while its running programs finish. It answered ``ok`` (200) until it stopped listening, so a
load balancer kept sending it requests that each got ``503 busy``."""

from __future__ import annotations

import signal
import time

import pytest
from holding_program import holding
from http_helpers import get

import kcoral


def wait_until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize(
    "kcoral_server", [["--worker-termination-grace-seconds", "1"]], indirect=True
)
def test_a_draining_server_answers_health_unavailable_with_the_published_keys(
    kcoral_server, tmp_path
) -> None:
    before = get(kcoral_server.url, "/health")
    assert before.status == 200 and before.body["status"] == "ok"
    marker, go = tmp_path / "started", tmp_path / "go"
    running = kcoral.Client(kcoral_server.url).submit(holding(marker, go))
    assert wait_until(marker.exists)
    kcoral_server.process.send_signal(signal.SIGTERM)
    assert wait_until(lambda: "Shutdown requested" in kcoral_server.stderr())

    draining = get(kcoral_server.url, "/health")
    assert draining.status == 503
    assert "Retry-After" not in draining.headers  # as a router's 503 /health (PROTOCOL §12)
    assert draining.body["status"] == "unavailable"
    assert draining.body.keys() == before.body.keys()
    assert draining.body["load"].keys() == before.body["load"].keys()
    assert draining.body["load"]["request_capacity"] == 0
    assert draining.body["instance_id"] == before.body["instance_id"]
    # the client says what it is, not the router's "no ready node"
    with pytest.raises(kcoral.KCoralError) as refused:
        kcoral.Client(kcoral_server.url).health()
    assert refused.value.status_code == 503
    assert refused.value.message == "unavailable: the server is shutting down"

    go.touch()  # the running program finishes, as the drain lets it
    assert running.result(timeout=60).results["r"] == 1
    assert kcoral_server.process.wait(30) == 0
