"""Attack: another token holder reaches a job or a cached blob through a router (issue 16,
point 6). The router authenticates the client and tells the node who it is; the node's server
applies the same owner and cache rules as a plain server. Before the fix bob listed, read and
cancelled alice's job through the router, and got her cached bytes by hash.
"""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from identity_support import (
    TOKEN_A,
    TOKEN_B,
    TOKEN_R,
    bytes_program,
    execute,
    module_program,
    request,
    sha256,
    token_file,
)
from router_helpers import Node, ready_nodes, start_router

import kcoral

pytestmark = pytest.mark.slow
NODE_ENV = {"KCORAL_NODE_TOKEN": "identity-node-token-0123456789"}
WAIT = """
import os, time
def f(go):
    while not os.path.exists(go):
        time.sleep(0.02)
    return "alice's result"
"""
SECRET = b"alice's weights through a router " * 32


@pytest.fixture
def routed(tmp_path: Path):
    tokens = token_file(tmp_path / "secrets")
    # An unknown job id is 404 at once, as another identity's job is (ROUTER §13); in a
    # restarted router's first --reconnect-grace-seconds it would be 503 "not found yet".
    args = ("--auth-token-file", str(tokens), "--reconnect-grace-seconds", "0")
    router = start_router(tmp_path, *args, env=NODE_ENV)
    node = Node(tmp_path, router, "node-identity", NODE_ENV)
    try:
        ready_nodes(router, 1)
        yield router
    finally:
        node.stop()
        router.stop()


def test_through_a_router_another_identity_neither_reaches_a_job_nor_a_cached_blob(
    routed, tmp_path: Path
) -> None:
    url = routed.url
    go = tmp_path / "go"
    with kcoral.Client(url, token=TOKEN_A) as alice:
        job = alice.submit(module_program(WAIT, str(go)))
        unknown = request(url, "GET", f"/v1/jobs/{uuid.uuid4()}", TOKEN_B)
        for method, suffix in (("GET", ""), ("GET", "/result"), ("DELETE", "")):
            answer = request(url, method, f"/v1/jobs/{job.id}{suffix}", TOKEN_B)
            assert answer.status == 404, (method, suffix)
            assert answer.json["error"]["kind"] == "not_found"
        listed = request(url, "GET", "/v1/jobs", TOKEN_B)
        assert listed.status == 200 and job.id not in {j["job_id"] for j in listed.json}
        assert unknown.status == 404 and unknown.json["error"]["kind"] == "not_found"
        by_root = request(url, "GET", f"/v1/jobs/{job.id}", TOKEN_R)
        assert by_root.status == 200 and by_root.json["status"] in ("QUEUED", "RUNNING")
        go.touch()
        assert job.result().results["r"] == "alice's result"  # bob's DELETE did nothing

        blob = sha256(SECRET)
        before = execute(url, bytes_program(blob), TOKEN_B)
        stored = execute(url, bytes_program(blob), TOKEN_A, {blob: SECRET})
        assert stored.status == 200 and SECRET in stored.raw
        after = execute(url, bytes_program(blob), TOKEN_B)
    assert SECRET not in after.raw
    assert after.json["status"] == "CACHE_MISS"
    assert after.error_without_request_id() == before.error_without_request_id()


def _unknown_or_other(answer) -> tuple[int, str, str, bool]:
    """What an answer tells about an id: status, kind, message without its age, node named."""
    message = re.sub(r"\d+ s ago", "N s ago", answer.json["error"]["message"])
    return answer.status, answer.json["error"]["kind"], message, "x-kcoral-node" in answer.headers


def test_in_a_restarted_routers_grace_another_identitys_job_or_session_reads_as_unknown(
    tmp_path: Path,
) -> None:
    """Within --reconnect-grace-seconds an unknown id is 503 'not found yet'; a job or a
    session the router knew went to its node (or its index), which answered another
    identity 404: that difference told a holder of someone's id that it lived."""
    tokens = token_file(tmp_path / "secrets")
    args = ("--auth-token-file", str(tokens), "--reconnect-grace-seconds", "600")
    router = start_router(tmp_path, *args, env=NODE_ENV)
    node = Node(tmp_path, router, "node-grace", NODE_ENV)
    go = tmp_path / "go"
    try:
        ready_nodes(router, 1)
        url = router.url
        with kcoral.Client(url, token=TOKEN_A) as alice:
            job = alice.submit(module_program(WAIT, str(go)))
            session = alice.session()
            unknown_job = _unknown_or_other(
                request(url, "GET", f"/v1/jobs/{uuid.uuid4()}", TOKEN_B)
            )
            # an end asked for in the grace is kept and answered at once (ROUTER §13), for
            # any id: a DELETE reads as an unknown id's DELETE, a GET as an unknown id's GET
            unknown_session = {
                method: _unknown_or_other(
                    request(url, method, f"/v1/sessions/{uuid.uuid4()}", TOKEN_B)
                )
                for method in ("GET", "DELETE")
            }
            assert unknown_job[:2] == (503, "no_node") and not unknown_job[3]
            for method, suffix in (
                ("GET", ""),
                ("GET", "/result"),
                ("GET", "/events"),
                ("DELETE", ""),
            ):
                answer = request(url, method, f"/v1/jobs/{job.id}{suffix}", TOKEN_B)
                assert _unknown_or_other(answer) == unknown_job, (method, suffix, answer.json)
            for method in ("GET", "DELETE"):
                answer = request(url, method, f"/v1/sessions/{session.id}", TOKEN_B)
                assert _unknown_or_other(answer) == unknown_session[method], (method, answer.json)
            assert request(url, "GET", f"/v1/jobs/{job.id}", TOKEN_A).status == 200
            go.touch()
            assert job.result().results["r"] == "alice's result"  # bob's DELETE did nothing
            assert session.info()["state"] == "IDLE"  # and his session DELETE nothing
            session.close()
    finally:
        node.stop()
        router.stop()
