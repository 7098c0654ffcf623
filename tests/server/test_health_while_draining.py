"""``GET /health`` of a draining server (SERVER §12): still 200 ``ok`` with the published
keys, as PROTOCOL §12 fixes (a direct server answers 200 whenever it can answer), and
``request_capacity`` 0, which is how a health check that reads the body sees that it takes
nothing new. A published client's ``health()`` keeps working while the server finishes its
programs."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from holding_program import holding
from http_helpers import get
from waiting import wait_until

import kcoral

WITH_A_SHORT_GRACE = pytest.mark.parametrize(
    "kcoral_server", [["--worker-termination-grace-seconds", "1"]], indirect=True
)


@contextmanager
def draining_while_holding(kcoral_server, tmp_path: Path) -> Iterator[None]:
    """SIGTERM the server while a program holds its worker; the block runs during the
    drain; after it the program finishes, as the drain lets it, and the server exits 0."""
    marker, go = tmp_path / "started", tmp_path / "go"
    running = kcoral.Client(kcoral_server.url).submit(holding(marker, go))
    assert wait_until(marker.exists)
    kcoral_server.process.send_signal(signal.SIGTERM)
    assert wait_until(lambda: "Shutdown requested" in kcoral_server.stderr())
    yield
    go.touch()
    assert running.result(timeout=60).results["r"] == 1
    assert kcoral_server.process.wait(30) == 0


@WITH_A_SHORT_GRACE
def test_a_draining_server_answers_health_ok_with_no_request_capacity(
    kcoral_server, tmp_path
) -> None:
    before = get(kcoral_server.url, "/health")
    assert before.status == 200 and before.body["status"] == "ok"
    assert before.body["load"]["request_capacity"] > 0
    with draining_while_holding(kcoral_server, tmp_path):
        draining = get(kcoral_server.url, "/health")
        assert draining.status == 200 and draining.body["status"] == "ok"
        assert draining.body.keys() == before.body.keys()
        assert draining.body["load"].keys() == before.body["load"].keys()
        assert draining.body["load"]["request_capacity"] == 0
        assert draining.body["instance_id"] == before.body["instance_id"]
        assert kcoral.Client(kcoral_server.url).health()["load"]["request_capacity"] == 0


@WITH_A_SHORT_GRACE
def test_a_draining_server_says_so_in_its_worker_status_and_nothing_more(
    kcoral_server, tmp_path
) -> None:
    # What a node's supervisor reads to report the node `draining` to its router (ROUTER
    # §6): without it a server SIGTERM'd alone stayed `ready` there and got new work it
    # answered 503 busy. The field tells any loopback caller what /health's
    # request_capacity 0 already does, and nothing else appears with it.
    before = get(kcoral_server.url, "/internal/worker-status")
    assert before.status == 200 and before.body["draining"] is False
    with draining_while_holding(kcoral_server, tmp_path):
        draining = get(kcoral_server.url, "/internal/worker-status")
        assert draining.status == 200 and draining.body["status"] == "ok"
        assert draining.body["draining"] is True
        assert draining.body.keys() == before.body.keys()
        assert draining.body["instance_id"] == before.body["instance_id"]
