"""A mixed fleet behind a real router (ROUTER §6), driven with raw published-protocol
requests (no selector): three real CPU nodes, one of them reporting another kind through the
test-only kind override. Requests go to the default kind's nodes, ``/health`` describes that
kind, a second node of the default kind with other versions is refused as today, and
``/v1/info`` lists the fleet by kind and label."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kcoral_server.node import supervisor as supervisor_module
from raw_http import call_program, post_execute, request
from router_helpers import Node, start_router, stopping
from waiting import wait_for

pytestmark = pytest.mark.slow

OTHER_KIND = {"gpu": "h100", "arch": "sm_90a", "memory_bytes": 80 << 30, "gpus": 1}
SOURCE = "import os\n\ndef main():\n    return os.getpid()\n"


def node_states(router) -> dict[str, str]:
    """Each node's latest state, from the router's node_state log lines."""
    states: dict[str, str] = {}
    for line in router.log().splitlines():
        if "node_state" in line and "node=" in line and "state=" in line:
            states[line.split("node=")[1].split()[0]] = line.split(" state=")[1].split()[0]
    return states


def served_by(router, count: int) -> list[str]:
    lines = [line for line in router.log().splitlines() if "request_finished" in line]
    return [line.split("node=")[1].split()[0] for line in lines[-count:] if "node=" in line]


def test_a_mixed_fleet_serves_published_clients_as_today(tmp_path: Path) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    first = Node(tmp_path, router, "cpu-a", None, "--node-label", "pool=small")
    nodes = [first]
    with stopping(router, nodes):
        wait_for(
            lambda: node_states(router).get("cpu-a") == "ready",
            "cpu-a ready",
            90.0,
            detail=router.log,
        )
        other_kind = {
            supervisor_module.NODE_KIND_OVERRIDE_ENV: json.dumps(OTHER_KIND),
            supervisor_module.VERSIONS_OVERRIDE_ENV: '{"torch": "another"}',
        }
        odd_versions = {supervisor_module.VERSIONS_OVERRIDE_ENV: '{"torch": "another"}'}
        nodes.append(Node(tmp_path, router, "h100-a", other_kind, "--node-label", "pool=big"))
        nodes.append(Node(tmp_path, router, "cpu-b", odd_versions))
        wait_for(
            lambda: (
                node_states(router).get("h100-a") == "ready"
                and node_states(router).get("cpu-b") == "incompatible"
            ),
            "h100-a ready (another kind may differ), cpu-b incompatible (one kind agrees)",
            90.0,
            detail=router.log,
        )

        # /health describes the default kind: the first node's, without the override.
        health = request(router.url, "GET", "/health")
        assert health.status == 200 and health.body["status"] == "ok"
        assert set(health.body) == {
            "status",
            "instance_id",
            "started_at",
            "gpu_count",
            "load",
            "target",
            "versions",
        }
        assert health.body["target"] == {}
        assert health.body["versions"].get("torch") != "another"
        assert health.body["load"]["request_capacity"] == 1  # cpu-a's one worker slot

        # Raw /execute requests without a selector all run on the default kind's node.
        for _ in range(6):
            answer = post_execute(router.url, call_program(SOURCE))
            assert answer.status == 200, answer.raw[:500]
            assert answer.body["status"] == "COMPLETED"
        wait_for(
            lambda: len(served_by(router, 6)) == 6, "six requests logged", 90.0, detail=router.log
        )
        assert set(served_by(router, 6)) == {"cpu-a"}

        # A routing preference for a node of another kind does not take a request there.
        pinned = post_execute(router.url, call_program(SOURCE), headers={"X-KCoral-Node": "h100-a"})
        assert pinned.status == 200 and pinned.body["status"] == "COMPLETED"
        wait_for(
            lambda: len(served_by(router, 7)) == 7,
            "the pinned request logged",
            90.0,
            detail=router.log,
        )
        assert served_by(router, 1) == ["cpu-a"]

        # /v1/info is the default kind's node's, plus the fleet by kind and label.
        info = request(router.url, "GET", "/v1/info")
        assert info.status == 200 and info.body["device"] == "cpu"
        assert info.body["fleet"] == {
            "kinds": [
                {"gpu": "cpu", "arch": None, "gpus": 0, "nodes": 1, "default": True},
                {"gpu": "h100", "arch": "sm_90a", "gpus": 1, "nodes": 1, "default": False},
            ],
            "labels": [
                {"key": "pool", "value": "big", "nodes": 1},
                {"key": "pool", "value": "small", "nodes": 1},
            ],
        }
