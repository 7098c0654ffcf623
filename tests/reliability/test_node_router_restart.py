"""A node outlives its router: it reconnects to the restarted router and still stops cleanly.

Found running nodes as Slurm jobs (issue 33, point 5): a router that went away between two
status reports left the supervisor's next write to a call that had already ended, which
raised ``InvalidStateError``; that ended its status reports for good (the node never came
back) and made its SIGTERM stop end in a traceback with exit status 1, so a drained Slurm
job ended ``FAILED``. A real router process and a real node (supervisor + CPU server).
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import Node, RouterProcess, ready_nodes, start_router


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def router_on(tmp_path: Path, port: int) -> RouterProcess:
    return start_router(tmp_path, "--port", str(port), "--status-check-interval-seconds", "0.3")


def test_a_node_reconnects_to_its_restarted_router_and_a_sigterm_still_stops_it_cleanly(
    tmp_path: Path,
) -> None:
    port = free_port()
    router = router_on(tmp_path, port)
    node = Node(tmp_path, router, "n1")
    try:
        ready_nodes(router, 1)
        router.process.kill()  # gone between two status reports
        router.process.wait()
        deadline = time.monotonic() + 60
        while "supervisor_disconnected" not in node.log_path.read_text():
            assert node.process.poll() is None, node.log_path.read_text()
            assert time.monotonic() < deadline, node.log_path.read_text()
            time.sleep(0.1)
        router = router_on(tmp_path, port)
        ready_nodes(router, 1)  # the same node serves the new router
        node.process.send_signal(signal.SIGTERM)
        assert node.process.wait(60) == 0, node.log_path.read_text()
        assert "Traceback" not in node.log_path.read_text()
    finally:
        node.stop()
        router.stop()
