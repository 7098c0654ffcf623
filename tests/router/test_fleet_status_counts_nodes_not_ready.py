"""A node that drains or goes quiet shows as such in ``/v1/info``'s ``fleet_status`` (ROUTER
§6 ``not_ready``), not as a smaller fleet: through a real router with three real CPU nodes,
one drained by SIGTERM and one whose supervisor is stopped (SIGSTOP). A rogue node moves
only its own count."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.display import fleet_rows
from kcoral_server.router.admission.selection import fleet_status
from kcoral_server.router.nodes.registry import Registry
from kcoral_server.router.settings import RouterSettings
from kcoral_shell import kcoral_shell
from raw_http import request
from router_helpers import Node, ready_nodes, start_router, stopping
from test_router_kinds import join, status


def not_ready_states(router) -> dict[str, int] | None:
    """The ``cpu`` kind's not-ready node counts, or None while ``/v1/info`` has no answer."""
    info = request(router.url, "GET", "/v1/info")
    if info.status != 200:
        return None
    rows: list[dict[str, Any]] = info.body["fleet_status"]["not_ready"]
    return next((row["states"] for row in rows if row["gpu"] == "cpu"), {})


def test_a_drained_node_and_a_stopped_one_are_counted_by_state_beside_the_ready_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = start_router(
        tmp_path,
        "--status-check-interval-seconds",
        "0.3",
        "--max-status-age-seconds",
        "3",
    )
    nodes = [Node(tmp_path, router, name, None) for name in ("cpu-a", "cpu-b", "cpu-c")]
    stopped: list[int] = []
    with stopping(router, nodes):
        try:
            ready_nodes(router, 3)
            assert not_ready_states(router) == {}, router.log()

            nodes[1].process.send_signal(signal.SIGTERM)  # drains, then leaves
            os.kill(nodes[2].process.pid, signal.SIGSTOP)  # its statuses stop: stale
            stopped.append(nodes[2].process.pid)
            deadline = time.monotonic() + 60
            states = not_ready_states(router)
            while states not in ({"left": 1, "unhealthy": 1}, {"draining": 1, "unhealthy": 1}):
                assert time.monotonic() < deadline, f"{states}\n{router.log()}"
                time.sleep(0.2)
                states = not_ready_states(router)

            info = request(router.url, "GET", "/v1/info").body
            (kind,) = info["fleet_status"]["kinds"]
            assert (kind["gpu"], kind["nodes"]) == ("cpu", 1)  # published meaning: ready ones
            assert info["fleet"]["kinds"][0]["nodes"] == 1

            # what a notebook's %kcoral status shows of it
            with kcoral_shell(router.url, monkeypatch, ()) as ip, capture_output() as shown:
                ip.run_line_magic("kcoral", "status")
            table = shown.outputs[-1].data["text/plain"]
            row = re.compile(r"gpu=cpu \(default\) +1/3 ready · 1 (draining|left) · 1 unhealthy ")
            assert row.search(table), table
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)


def test_a_rogue_node_claiming_draining_moves_only_its_own_count() -> None:
    registry = Registry(RouterSettings())
    join(registry, "h1", "h100")
    join(registry, "h2", "h100")
    rogue = registry.attach_supervisor("rogue")
    assert rogue is not None
    registry.apply_status(rogue, status("rogue", "h100", {"torch": "1"}))
    draining = status("rogue", "h100", {"torch": "1"})
    draining.draining = True
    registry.apply_status(rogue, draining)
    # the same claim under another node's id is refused while that node's stream lives
    assert registry.attach_supervisor("h1") is None

    rows = fleet_status(registry)
    assert [(k["gpu"], k["nodes"]) for k in rows["kinds"]] == [("h100", 2)]
    assert rows["not_ready"] == [
        {"gpu": "h100", "arch": "sm_90a", "gpus": 1, "default": True, "states": {"draining": 1}}
    ]


def test_a_kind_with_no_ready_node_has_its_own_row_and_a_state_no_router_names_reads_other() -> (
    None
):
    h100 = {"gpu": "h100", "arch": "sm_90a", "gpus": 8, "default": False}
    shown = fleet_rows(
        {
            "kinds": [{"gpu": "cpu", "arch": None, "gpus": 0, "default": True, "nodes": 2}],
            "labels": [],
            "not_ready": [
                h100 | {"states": {"draining": 1, "\x1b[2Jevil": 2, "left": True}},
                {"gpu": "cpu", "arch": None, "gpus": 0, "default": True, "states": {}},
            ],
        }
    )
    assert shown == [
        ["gpu=cpu (default)", "2", "\u2014", "\u2014", "\u2014"],
        ["gpu=h100 sm_90a x8", "0/3 ready · 1 draining · 2 other", "\u2014", "\u2014", "\u2014"],
    ]
