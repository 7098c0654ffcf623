"""``kcoral_router_node_busy`` and ``kcoral_router_kind_busy`` (EXTENSIONS §13) count a node's
running jobs: through a real router onto a real one-worker CPU node, a job holds the node's
only seat, and once the node's supervisor has reported it (``fleet_status`` reads no free
seat) the router's ``/metrics`` reads one busy on the node and on its kind. Before, both
counted only requests on the router's slots, which a job gives back with its ``202``: a
fleet running a job on every seat read as idle (0 busy of N workers) on the dashboard."""

from __future__ import annotations

from pathlib import Path

import pytest
from raw_http import request
from router_helpers import Node, start_router, stopping
from test_router_fleet_status import HOLD, only_kind, wait_until_its_seat_is_free
from waiting import wait_for

import kcoral

pytestmark = pytest.mark.slow


def gauge(text: str, sample: str) -> float:
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(sample + " ")]
    assert len(values) == 1, (sample, text)
    return float(values[0])


def test_a_node_running_a_job_on_its_only_seat_reads_busy_in_the_router_metrics(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, router, "cpu-a", None)
    with stopping(router, [node]):
        wait_until_its_seat_is_free(router)
        release = tmp_path / "release"
        program = kcoral.Program()
        module = program.upload(kind="module", source=HOLD)
        held = program.run(fn=program.get_function(module=module, name="main"), args=[str(release)])
        program.return_(key="pid", value=held)
        with kcoral.Client(router.url) as client:
            job = client.submit(program, timeout_seconds=120)
            # the supervisor has reported the seat taken
            wait_for(
                lambda: only_kind(router)["free_seats"] == 0,
                "the seat taken",
                90.0,
                detail=router.log,
            )
            text = request(router.url, "GET", "/metrics").raw.decode()
            release.write_text("go")
            assert job.result(timeout=120).status == "COMPLETED"
        assert gauge(text, 'kcoral_router_node_busy{node="cpu-a"}') == 1
        assert gauge(text, 'kcoral_router_kind_busy{kind="cpu"}') == 1
