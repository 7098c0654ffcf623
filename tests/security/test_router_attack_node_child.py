"""Attacks on a node's child server and its secrets (issue 16, 5d and point 3), against a
real router and a real node (supervisor + CPU server child) on loopback.

Attackers: a *program* on the node machine (it can reach the child's loopback port and read
``/proc`` as the server's user, without a sandbox), and *another token holder* at the router.
Before the fix the child answered ``/v1/jobs`` on its port to anyone, and its environment
held the node token (which workers inherited); until issue 28 it answered ``/health`` and
``/internal/worker-status``, with the server instance id, to anyone.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))

from deploy_files import container, resource
from router_helpers import Node, ready_nodes, start_router

import kcoral

pytestmark = pytest.mark.slow

NODE_TOKEN = "node-token-0123456789abcdef"
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"

ENVIRONMENT = """
import os
def f():
    return {k: v for k, v in os.environ.items() if k.startswith("KCORAL")}
"""

WAIT_FOR_GO = """
import os, time
def f(go):
    while not os.path.exists(go):
        time.sleep(0.02)
    return "alice's result"
"""


def program(source: str, *args: object) -> kcoral.Program:
    built = kcoral.Program()
    module = built.upload(kind="module", source=source)
    fn = built.get_function(module=module, name="f")
    built.return_(key="r", value=built.run(fn=fn, args=list(args)))
    return built


def answer(port: int, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=b"" if method == "POST" else None, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def get(port: int, method: str, path: str, headers: dict[str, str]) -> int:
    return answer(port, method, path, headers)[0]


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("routed-child")
    clients = tmp / "clients"
    clients.write_text(f"alice {ALICE}\nbob {BOB}\n")
    router = start_router(
        tmp,
        "--status-check-interval-seconds",
        "0.3",
        "--auth-token-file",
        str(clients),
        # another identity's job or session is 404 at once, as an unknown id (in a router's
        # first --reconnect-grace-seconds both are 503 "not found yet", ROUTER §13)
        "--reconnect-grace-seconds",
        "0",
        env={"KCORAL_NODE_TOKEN": NODE_TOKEN},
    )
    child_ready = tmp / "child-url"
    node = Node(
        tmp, router, "node-a", {"KCORAL_NODE_TOKEN": NODE_TOKEN}, "--ready-file", str(child_ready)
    )
    try:
        ready_nodes(router, 1)
        deadline = time.monotonic() + 30
        while not (child_ready.exists() and child_ready.read_text().strip()):
            assert time.monotonic() < deadline, "the supervisor never wrote the child's URL"
            time.sleep(0.05)
        child_port = int(child_ready.read_text().strip().rsplit(":", 1)[1])
        yield router, node, child_port, tmp
    finally:
        node.stop()
        router.stop()


def test_the_node_childs_port_serves_only_its_tunnel(routed) -> None:
    router, _node, port, _tmp = routed
    loopback = {"Host": f"127.0.0.1:{port}"}
    for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/info"), ("POST", "/execute")):
        assert get(port, method, path, loopback) == 401, (method, path)
        forged = {**loopback, "X-KCoral-Identity": "alice"}
        assert get(port, method, path, forged) == 401, (method, path)
        for token in (NODE_TOKEN, ALICE):  # neither is the child's secret
            with_token = {**forged, "Authorization": f"Bearer {token}"}
            assert get(port, method, path, with_token) == 401, (method, path, token)
    # The router path still works (and the supervisor's probes, or the node would not be
    # ready): both present the child's secret.
    with kcoral.Client(router.url, token=ALICE) as client:
        assert "jobs" in client.info()["features"]


def test_a_local_process_gets_401_from_the_node_childs_health_and_worker_status(routed) -> None:
    # Issue 28, point 3: both carried the server instance id, the one value a holder of the
    # node token lacked to open slots under this node's id.
    router, _node, port, _tmp = routed
    loopback = {"Host": f"127.0.0.1:{port}"}
    for path in ("/health", "/internal/worker-status"):
        for headers in (
            loopback,
            {**loopback, "Authorization": f"Bearer {NODE_TOKEN}"},
            {**loopback, "Authorization": f"Bearer {ALICE}", "X-KCoral-Identity": "alice"},
        ):
            status, body = answer(port, "GET", path, headers)
            assert status == 401, (path, headers)
            document = json.loads(body)
            assert set(document) == {"status", "request_id", "error"}
            assert document["error"]["kind"] == "unauthorized"
            assert b"instance_id" not in body and b"versions" not in body
    # This node's supervisor announced a slot key: its slots (which carry work, or the node
    # would not be ready) presented it, and the router did not fall back to the token alone.
    assert "node_without_slot_key" not in router.log()


def test_the_node_pods_probes_take_the_childs_401_as_the_server_answering(routed) -> None:
    # deploy/kubernetes/node.yaml probes the child's /health, which now answers 401 only.
    _router, _node, port, _tmp = routed
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    box = container(resource("DaemonSet", "kcoral-node"))
    for probe in ("startupProbe", "readinessProbe"):
        _interpreter, _flag, code = box[probe]["exec"]["command"]
        assert "127.0.0.1:8000" in code
        for target, ready in ((port, True), (closed, False)):
            run = subprocess.run(
                [sys.executable, "-c", code.replace("127.0.0.1:8000", f"127.0.0.1:{target}")],
                capture_output=True,
                timeout=60,
            )
            assert (run.returncode == 0) == ready, (probe, target, run.stderr)


def test_neither_the_node_token_nor_the_child_secret_reaches_the_child_or_a_program(
    routed,
) -> None:
    router, node, _port, _tmp = routed
    child = node.server_pid()
    environ = Path(f"/proc/{child}/environ").read_bytes()
    cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
    names = [entry.split(b"=", 1)[0] for entry in environ.split(b"\0") if entry]
    for blob in (environ, cmdline):
        assert NODE_TOKEN.encode() not in blob
        assert ALICE.encode() not in blob
    credentials = [
        n for n in names if n.startswith(b"KCORAL_") and n.endswith((b"TOKEN", b"SECRET"))
    ]
    assert credentials == []
    with kcoral.Client(router.url, token=ALICE) as client:
        outcome = client.execute(program(ENVIRONMENT))
    assert outcome.completed, (outcome, outcome.error)
    seen = outcome.results["r"]
    assert NODE_TOKEN not in json.dumps(seen)
    assert not [k for k in seen if k.endswith(("TOKEN", "SECRET"))]


def test_a_job_submitted_through_the_router_is_not_found_for_another_identity(routed) -> None:
    router, _node, _port, tmp = routed
    go = tmp / "go"
    with kcoral.Client(router.url, token=ALICE) as alice:
        job = alice.submit(program(WAIT_FOR_GO, str(go)))
        try:
            with kcoral.Client(router.url, token=BOB) as bob:
                assert bob.request("GET", f"/v1/jobs/{job.id}").status == 404
                assert bob.request("DELETE", f"/v1/jobs/{job.id}").status == 404
                listed = json.loads(bob.request("GET", "/v1/jobs").data)
                assert job.id not in [entry["job_id"] for entry in listed]
            assert job.status()["status"] in ("QUEUED", "RUNNING")
        finally:
            go.touch()
        assert job.result().results["r"] == "alice's result"
