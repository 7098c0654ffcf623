"""A node's ``--no-log-console`` (SERVER §2, ROUTER §12): its supervisor writes only its
WARNING and ERROR lines (it has no log file, so its problems are still said), as the
server it starts writes none. Before, every supervisor line was printed whatever the flag."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from kcoral_server.router.log import RouterLog
from router_helpers import Node, ready_nodes, start_router, stopping


def test_a_problems_only_log_writes_warnings_and_errors_but_no_info_lines() -> None:
    out = io.StringIO()
    seen: list[str] = []
    log = RouterLog(out, problems_only=True)
    log.add_listener(lambda event, _fields: seen.append(event))
    log.event("supervisor_connected", node_id="n1")
    log.event("server_child_exited", level="WARNING", node_id="n1")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "WARNING server_child_exited node_id=n1" in lines[0]
    assert seen == ["supervisor_connected", "server_child_exited"]  # metrics count both


@pytest.mark.slow
def test_a_node_with_no_log_console_prints_no_supervisor_info_lines(tmp_path: Path) -> None:
    router = start_router(tmp_path)
    quiet = Node(tmp_path, router, "quiet-a", None, "--no-log-console")
    with stopping(router, [quiet]):
        ready_nodes(router, 1)
    said = quiet.log_path.read_text()
    assert "supervisor_connected" not in said and "supervisor_stopped" not in said, said
    assert "server_child_started" not in said, said
