"""A node that drains takes no queued work (ROUTER §6, §7): through a real router onto a real
CPU node, a program holds the node's only seat while a second, whose selector only that node
fits, waits at the router; the node is sent SIGTERM, and once its held program has answered
the waiter is refused ``503 no_matching_node`` as the node leaves, instead of being sent
down the slot the drain was closing (``502 server_transport``, or the node's own ``503
busy``)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from raw_http import call_program, post_execute
from router_helpers import Node, RouterProcess, start_router, stopping
from test_router_fleet_status import HOLD, only_kind
from test_router_mixed_fleet import node_states
from waiting import wait_for

pytestmark = pytest.mark.slow


def send(
    router, program: dict[str, Any], headers: dict[str, str], answers: dict
) -> threading.Thread:
    def run() -> None:
        answers[headers.get("X-KCoral-Select", "")] = post_execute(
            router.url, program, headers=headers
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_until_draining(router: RouterProcess, node: Node) -> None:
    """Until ``node``'s server has begun its drain and the router reads the node
    ``draining``."""
    wait_for(
        lambda: "shutdown_started" in node.log_path.read_text(),
        f"{node.node_id}'s drain",
        90.0,
        detail=router.log,
    )
    wait_for(
        lambda: node_states(router).get(node.node_id) == "draining",
        f"{node.node_id} draining",
        90.0,
        detail=router.log,
    )


def test_a_request_waiting_for_a_draining_node_is_refused_and_never_sent_down_its_closing_slot(
    tmp_path: Path,
) -> None:
    # The node stays ``ready`` through its drain's failing statuses (a high threshold): what
    # keeps queued work off it must be the drain itself, however long the threshold.
    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.3", "--unhealthy-threshold", "1000"
    )
    node = Node(tmp_path, router, "cpu-a", None, "--node-label", "zone=a")
    with stopping(router, [node]):
        wait_for(
            lambda: (k := only_kind(router)) and k["seats"] == 1, "ready", 90.0, detail=router.log
        )
        release = tmp_path / "release"
        answers: dict[str, Any] = {}
        held = send(router, call_program(HOLD, args=[str(release)]), {}, answers)
        wait_for(
            lambda: only_kind(router)["free_seats"] == 0, "the seat taken", 90.0, detail=router.log
        )
        waiter = send(
            router, call_program(HOLD, args=[str(release)]), {"X-KCoral-Select": "zone=a"}, answers
        )
        wait_for(
            lambda: only_kind(router)["queued"] == 1, "the second queued", 90.0, detail=router.log
        )

        node.process.send_signal(signal.SIGTERM)
        # An operator's drain is not a failure: the node reads `draining`, never `unhealthy`
        wait_until_draining(router, node)
        release.write_text("go")
        held.join(120)
        waiter.join(120)
        wait_for(
            lambda: "node_disconnected node=cpu-a" in router.log(), "left", 90.0, detail=router.log
        )
        after = router.log().split("state=draining", 1)[1].splitlines()
        assert not [line for line in after if " state=unhealthy" in line], after

        assert answers[""].status == 200
        refused = answers["zone=a"]
        assert refused.status == 503, (refused.status, refused.body)
        assert refused.body["error"]["kind"] == "no_matching_node"
        assert "zone=a" in refused.body["error"]["message"]
