"""Jobs through a router with a client token, onto two real CPU nodes (EXTENSIONS §5, §6).

Liveness is proven by order (output seen while the program waits for a file the test
creates afterwards), never by timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
from router_helpers import Node, ready_nodes, start_router, stopping
from waiting import wait_for_file

import kcoral
from kcoral.errors import KCoralError

pytestmark = pytest.mark.slow
TOKEN = "router-client-token"

WAIT_FOR_FILE = """
import os, time
def f(marker, go):
    print("first", flush=True)
    open(marker, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    print("second")
    return 7
"""

DIGEST = """
import hashlib
import json
def f(data):
    return hashlib.sha256(data).hexdigest()
"""


def module_program(source: str, *args: object, blob: bytes | None = None) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=source)
    function = program.get_function(module=module, name="f")
    if blob is not None:
        args = (program.upload(kind="bytes", value=blob), *args)
    program.return_(key="r", value=program.run(fn=function, args=list(args)))
    return program


def submission_nodes(log: str) -> list[str]:
    """The node of every ``POST /v1/jobs`` the router logged, in order."""
    return [
        line.split("node=")[1].split()[0]
        for line in log.splitlines()
        if "method=POST path=/v1/jobs " in line and "node=" in line
    ]


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("routed-jobs")
    # A router with a client token needs a node token too (ROUTER §3).
    nodes_env = {"KCORAL_NODE_TOKEN": "routed-node-token"}
    router = start_router(
        tmp,
        "--status-check-interval-seconds",
        "0.3",
        "--reconnect-grace-seconds",  # an unknown job id: 404 at once (ROUTER §13)
        "0",
        env={"KCORAL_AUTH_TOKEN": TOKEN, **nodes_env},
    )
    nodes = [Node(tmp, router, "node-a", nodes_env), Node(tmp, router, "node-b", nodes_env)]
    with stopping(router, nodes):
        ready_nodes(router, 2)
        yield router, tmp


def test_a_routed_job_streams_its_output_live_and_can_be_reattached(routed):
    router, tmp = routed
    marker, go = tmp / "marker", tmp / "go"
    with kcoral.Client(router.url, token=TOKEN) as client:
        info = client.info()
        assert "jobs" in info["features"] and "auth" in info["features"]
        assert info["kcoral"] == kcoral.__version__
        job = client.submit(module_program(WAIT_FOR_FILE, str(marker), str(go)))
        seen = []
        for event in job.events():
            seen.append(event)
            if event.kind == "stdout" and "first" in event.text:
                # The program cannot end before this file exists: the event came mid-run.
                assert job.status()["status"] == "RUNNING"
                go.touch()
        assert seen[-1].finished and seen[-1].data["status"] == "COMPLETED"
        assert "".join(e.text for e in seen if e.kind == "stdout") == "first\nsecond\n"
    with kcoral.Client(router.url, token=TOKEN) as other:
        again = other.job(job.id)
        assert again.status()["status"] == "COMPLETED"
        result = again.result()
        assert result.results["r"] == 7 and result.stdout == "first\nsecond\n"
        listed = other.request("GET", "/v1/jobs")
        assert listed.status == 200
        assert job.id in [entry["job_id"] for entry in json.loads(listed.data)]
        # ?limit reaches the nodes through their tunnels (EXTENSIONS §5, ROUTER §13)
        newest = other.request("GET", "/v1/jobs?limit=1")
        assert [entry["job_id"] for entry in json.loads(newest.data)] == [job.id]
        assert newest.headers.get("x-kcoral-jobs-left-out") == "0"
        assert newest.headers.get("x-kcoral-nodes-left-out") is None


def test_a_routed_job_can_be_cancelled_while_it_runs(routed):
    router, tmp = routed
    marker, never = tmp / "marker-cancel", tmp / "never"
    with kcoral.Client(router.url, token=TOKEN) as client:
        job = client.submit(module_program(WAIT_FOR_FILE, str(marker), str(never)))
        wait_for_file(marker, 60.0)
        assert job.status()["status"] == "RUNNING"
        assert job.cancel()["status"] == "CANCELLED"
        with pytest.raises(KCoralError) as caught:
            job.result()
        assert caught.value.status_code == 409 and caught.value.kind == "cancelled"
        assert list(job.events())[-1].data["status"] == "CANCELLED"
        with pytest.raises(KCoralError) as missing:
            client.job("0c8f7a4e-4d7e-4a51-9d55-000000000000").status()
        assert missing.value.status_code == 404 and missing.value.kind == "not_found"


def test_a_routed_job_with_a_blob_retries_its_cache_miss_on_the_same_node(routed):
    router, _tmp = routed
    payload = os.urandom(1 << 20)
    before = len(submission_nodes(router.log()))
    with kcoral.Client(router.url, token=TOKEN) as client:
        job = client.submit(module_program(DIGEST, blob=payload))
        assert job.result().results["r"] == hashlib.sha256(payload).hexdigest()
    deadline = time.monotonic() + 10
    while len(submission_nodes(router.log())) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    submissions = submission_nodes(router.log())[before:]
    assert len(submissions) == 2, "expected a cache miss, then the retry with the blob"
    assert submissions[0] == submissions[1]


def test_the_routed_cluster_refuses_requests_without_the_client_token(routed):
    router, _tmp = routed
    with kcoral.Client(router.url) as client:
        assert client.health()["status"] == "ok"  # /health needs no token
        with pytest.raises(KCoralError) as caught:
            client.execute(module_program("def f():\n    return 1\n"))
        assert caught.value.status_code == 401 and caught.value.kind == "unauthorized"
    with kcoral.Client(router.url, token=TOKEN) as client:
        assert client.execute(module_program("def f():\n    return 1\n")).results["r"] == 1


def test_a_client_leaving_a_job_event_stream_leaves_no_traceback_in_the_router_log(routed):
    """``job.result()`` follows the events until the finished phase and reads the stream's
    end: a completed request. A client that stops reading mid-run has left: one line that
    says so, never an uncaught exception of the router."""
    router, tmp = routed
    marker, go = tmp / "marker-leave", tmp / "go-leave"
    with kcoral.Client(router.url, token=TOKEN) as client:
        waited = client.submit(module_program(DIGEST, blob=b"done"))
        assert waited.result(timeout=60).completed
        job = client.submit(module_program(WAIT_FOR_FILE, str(marker), str(go)))
        wait_for_file(marker, 60.0)
        for event in job.events():
            if event.kind == "stdout":
                break  # hang up mid-run
        go.touch()
        assert job.result(timeout=60).results["r"] == 7
    mark = router.lines_after_mark(TOKEN)  # every answered request's line is in
    log = router.log().splitlines()[:mark]

    def streams(job_id: str) -> list[str]:
        return [line for line in log if f"path=/v1/jobs/{job_id}/events " in line]

    assert [line.split("finish_reason=")[1] for line in streams(waited.id)] == ["completed"]
    reasons = [line.split("finish_reason=")[1] for line in streams(job.id)]
    assert reasons == ["client_disconnected", "completed"], streams(job.id)
    assert not [line for line in log if "Uncaught exception" in line or "Traceback" in line]
