"""A request that waited for a worker and got none (503 ``busy``, a cancel, a client that
left) is counted in ``kcoral_queue_wait_seconds`` under ``gpu="none"`` and logged with its
``waited_ms`` (EXTENSIONS §13, SERVER §13): under overload the histogram counted only the
requests that got a worker, so its quantiles missed exactly the longest waits."""

from __future__ import annotations

import threading

import pytest
from http_helpers import execute, module_program
from metrics_support import scrape
from server_process import start_server
from test_failures import NAP
from waiting import wait_until

WAIT_SECONDS = 0.5
WAITED_IN_VAIN = 'kcoral_queue_wait_seconds_count{gpu="none"}'


@pytest.fixture
def server(tmp_path):
    running = start_server(
        tmp_path / "server",
        ["--num-workers", "1", "--worker-wait-timeout-seconds", str(WAIT_SECONDS)],
    )
    yield running
    running.stop()


def test_a_request_refused_busy_after_its_wait_is_counted_as_a_wait_with_no_gpu(
    server, tmp_path
) -> None:
    marker = tmp_path / "started"
    busy = threading.Thread(
        target=lambda: execute(server.url, module_program(NAP, [("nap", [str(marker), 3])]))
    )
    busy.start()
    assert wait_until(marker.exists)
    before = scrape(server.url)
    refused = execute(server.url, module_program(NAP, [("nap", [str(marker), 0])]))
    assert refused.status == 503 and refused.body["error"]["kind"] == "busy"
    after = scrape(server.url)
    busy.join()
    assert after.get(WAITED_IN_VAIN, 0) == before.get(WAITED_IN_VAIN, 0) + 1
    # the server refuses only once the whole wait is over, so the wait counted is that long
    waited = after['kcoral_queue_wait_seconds_sum{gpu="none"}']
    assert waited - before.get('kcoral_queue_wait_seconds_sum{gpu="none"}', 0) >= WAIT_SECONDS
    finished = [
        e
        for e in server.events()
        if e.get("event") == "request_finished"
        and e.get("request_id") == refused.body["request_id"]
    ]
    assert finished[-1]["waited_ms"] >= WAIT_SECONDS * 1000
    assert "queue_ms" not in finished[-1] and "worker_id" not in finished[-1]


def test_a_request_that_got_a_worker_is_not_counted_as_a_wait_in_vain(server, tmp_path) -> None:
    before = scrape(server.url)
    served = execute(server.url, module_program(NAP, [("nap", [str(tmp_path / "m"), 0])]))
    assert served.status == 200
    after = scrape(server.url)
    assert after.get(WAITED_IN_VAIN, 0) == before.get(WAITED_IN_VAIN, 0)
    served_key = 'kcoral_queue_wait_seconds_count{gpu="cpu"}'
    assert after[served_key] >= before.get(served_key, 0) + 1


def test_a_sessions_refusal_is_no_wait(server, tmp_path) -> None:
    """A program sent to a session that runs one is refused at once (409 ``session_busy``):
    it never queued, and its near-zero "wait" pulled the queue-wait quantiles down
    (review)."""
    from concurrent.futures import ThreadPoolExecutor

    from session_requests import create_session, run_in

    session_id = create_session(server.url).body["session_id"]
    marker = tmp_path / "running"
    holding = module_program(NAP, [("nap", [str(marker), 3])])
    with ThreadPoolExecutor(1) as background:
        running = background.submit(run_in, server.url, session_id, holding)
        assert wait_until(marker.exists)
        before = scrape(server.url)
        refused = run_in(server.url, session_id, module_program(NAP, [("nap", [str(marker), 0])]))
        assert refused.status == 409, refused.body
        after = scrape(server.url)
        assert running.result().status == 200
    assert after.get(WAITED_IN_VAIN, 0) == before.get(WAITED_IN_VAIN, 0)
