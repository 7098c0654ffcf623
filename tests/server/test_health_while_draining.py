"""``GET /health`` of a draining server (SERVER §12): still 200 ``ok`` with the published
keys, as PROTOCOL §12 fixes (a direct server answers 200 whenever it can answer), and
``request_capacity`` 0, which is how a health check that reads the body sees that it takes
nothing new. A published client's ``health()`` keeps working while the server finishes its
programs."""

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
def test_a_draining_server_answers_health_ok_with_no_request_capacity(
    kcoral_server, tmp_path
) -> None:
    before = get(kcoral_server.url, "/health")
    assert before.status == 200 and before.body["status"] == "ok"
    assert before.body["load"]["request_capacity"] > 0
    marker, go = tmp_path / "started", tmp_path / "go"
    running = kcoral.Client(kcoral_server.url).submit(holding(marker, go))
    assert wait_until(marker.exists)
    kcoral_server.process.send_signal(signal.SIGTERM)
    assert wait_until(lambda: "Shutdown requested" in kcoral_server.stderr())

    draining = get(kcoral_server.url, "/health")
    assert draining.status == 200 and draining.body["status"] == "ok"
    assert draining.body.keys() == before.body.keys()
    assert draining.body["load"].keys() == before.body["load"].keys()
    assert draining.body["load"]["request_capacity"] == 0
    assert draining.body["instance_id"] == before.body["instance_id"]
    assert kcoral.Client(kcoral_server.url).health()["load"]["request_capacity"] == 0

    go.touch()  # the running program finishes, as the drain lets it
    assert running.result(timeout=60).results["r"] == 1
    assert kcoral_server.process.wait(30) == 0
