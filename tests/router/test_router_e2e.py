"""Router + two real CPU nodes (supervisor + server child) on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from kcoral_server.node import supervisor as supervisor_module
from router_helpers import Node, RouterProcess, http_request, ready_nodes, start_router, stopping

import kcoral

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path):
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    nodes = [Node(tmp_path, router, "node-a"), Node(tmp_path, router, "node-b")]
    with stopping(router, nodes):
        ready_nodes(router, 2)
        yield router, nodes


MODULE = """
import hashlib, os, time

def digest(data):
    return hashlib.sha256(data).hexdigest()

def pid():
    return os.getpid()

def nap(seconds):
    time.sleep(seconds)
    return seconds
"""


def call(name: str, *args, blob: bytes | None = None) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=MODULE)
    fn = program.get_function(module=module, name=name)
    if blob is not None:
        args = (program.upload(kind="bytes", value=blob), *args)
    program.return_(key="out", value=program.run(fn=fn, args=list(args)))
    return program


def finished_nodes(router: RouterProcess, count: int) -> list[str]:
    """The nodes of the router's finished ``/execute`` requests (their lines name no path;
    a client's ``GET /v1/info`` before a large body, CLIENT_API §2.1, is not one)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [
            line
            for line in router.log().splitlines()
            if "request_finished" in line and " path=" not in line
        ]
        if len(lines) >= count or time.monotonic() > deadline:
            return [line.split("node=")[1].split()[0] for line in lines if "node=" in line]
        time.sleep(0.05)


def test_requests_spread_over_both_nodes(cluster):
    router, _nodes = cluster
    with kcoral.Client(router.url) as client:
        for _ in range(12):
            assert client.execute(call("pid")).status == "COMPLETED"
    assert set(finished_nodes(router, 12)) == {"node-a", "node-b"}


def test_a_cache_miss_retry_lands_on_the_same_node_and_64_mib_pass_intact(cluster):
    router, _nodes = cluster
    payload = os.urandom(64 << 20)
    with kcoral.Client(router.url) as client:
        result = client.execute(call("digest", blob=payload))
    assert result["out"] == hashlib.sha256(payload).hexdigest()
    nodes = finished_nodes(router, 2)
    assert len(nodes) == 2, "expected a cache miss, then the retry with the blob"
    assert nodes[0] == nodes[1]


def test_a_killed_node_fails_its_request_with_502_and_comes_back(cluster):
    router, nodes = cluster
    with kcoral.Client(router.url) as client:
        pids = {}
        while len(pids) < 2:  # both nodes have served once
            count = len(finished_nodes(router, 0))
            result = client.execute(call("pid"))
            pids[finished_nodes(router, count + 1)[count]] = result["out"]
        victim = nodes[0]
        server_pid = victim.server_pid()

        def kill_soon() -> None:
            time.sleep(1.0)
            os.kill(server_pid, signal.SIGKILL)

        errors = []
        attempts = 0
        # Pin the slow request to the victim through the routing preference.
        with kcoral.Client(router.url, headers={"X-KCoral-Node": victim.node_id}) as pinned:
            killer = threading.Thread(target=kill_soon)
            killer.start()
            try:
                attempts += 1
                pinned.execute(call("nap", 20))
            except kcoral.KCoralError as exc:
                errors.append(exc)
            killer.join()
        assert errors and errors[0].status_code == 502 and errors[0].kind == "server_transport"
        # The other node keeps serving meanwhile.
        assert client.execute(call("pid")).status == "COMPLETED"
    log = router.wait_log("finish_reason=tunnel_disconnected")
    assert log.count("finish_reason=tunnel_disconnected") == 1  # never replayed
    # The supervisor restarts the server and the node becomes ready again.
    ready_nodes(router, 2)
    time.sleep(0.5)  # let the log catch up before counting
    before = len(finished_nodes(router, 0))
    with kcoral.Client(router.url, headers={"X-KCoral-Node": victim.node_id}) as pinned:
        assert pinned.execute(call("pid")).status == "COMPLETED"
    assert finished_nodes(router, before + 1)[before] == victim.node_id


def test_a_node_with_other_versions_is_incompatible_and_gets_no_work(tmp_path: Path):
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    good = Node(tmp_path, router, "good")
    odd = None
    try:
        ready_nodes(router, 1)
        odd = Node(tmp_path, router, "odd", {supervisor_module.VERSIONS_OVERRIDE_ENV: '{"x": "1"}'})
        deadline = time.monotonic() + 60
        while "odd" not in router.log() or "state=incompatible" not in router.log():
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        with kcoral.Client(router.url, headers={"X-KCoral-Node": "odd"}) as client:
            for _ in range(4):
                client.execute(call("pid"))
        assert set(finished_nodes(router, 4)) == {"good"}
    finally:
        for node in (good, odd):
            if node is not None:
                node.stop()
        router.stop()


def test_a_wrong_node_token_is_refused_and_the_right_one_accepted(tmp_path: Path):
    router = start_router(tmp_path, env={"KCORAL_NODE_TOKEN": "right"})
    wrong = Node(tmp_path, router, "wrong", {"KCORAL_NODE_TOKEN": "nope"})
    right = Node(tmp_path, router, "right", {"KCORAL_NODE_TOKEN": "right"})
    try:
        ready_nodes(router, 1)
        assert "node=wrong" not in router.log()
        time.sleep(1.0)
        body = asyncio.run(http_request(router.port, "GET", "/health")).json()
        assert body["load"]["request_capacity"] == 1
        # what to set, where the node's retries said only that the token was wrong
        assert (
            "UNAUTHENTICATED: invalid or missing node token (the node's KCORAL_NODE_TOKEN must "
            "be one this router accepts)"
        ) in wrong.log_path.read_text()
    finally:
        wrong.stop()
        right.stop()
        router.stop()
