"""Job and session ids the router has not bound to a node yet (it restarted, or forgot
them), against a real router and in-process fake nodes: a rogue node (a holder of the node
token) that claims such an id as well as its real node gets neither the id nor the owner's
requests for it, whether the claim is a look-up's 200 or an entry in a merged list
(ROUTER §13)."""

from __future__ import annotations

import asyncio
import json
import uuid

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import FakeNode, RouterProcess, http_request, wait_for_health

OK = [(b"content-type", b"application/json")]
NOT_FOUND = (404, OK, b'{"status":"ERROR","error":{"kind":"not_found","message":"no"}}')


def target(head: pb.RequestHead) -> tuple[str, str]:
    pseudo = {h.name.decode(): h.value.decode() for h in head.headers if h.name.startswith(b":")}
    return pseudo.get(":method", "POST"), pseudo.get(":path", "/execute")


def claiming_node(port: int, name: str, job: str, session: str, seen: list) -> FakeNode:
    """A node that says it holds ``job`` and ``session`` (in its lists and look-ups), and
    also has a job of its own, ``job-<name>``."""

    async def handler(head: pb.RequestHead, body: bytes):
        method, path = target(head)
        seen.append((name, method, path))
        if path == "/v1/jobs":
            jobs = [{"job_id": job, "submitted_at": "2026-01-01"}, {"job_id": f"job-{name}"}]
            return 200, OK, json.dumps(jobs).encode()
        if path == "/v1/sessions":
            record = {"session_id": session, "owner": "default", "created_at": 1.0}
            return 200, OK, json.dumps([record]).encode()
        if path.startswith((f"/v1/jobs/{job}", f"/v1/jobs/job-{name}")):
            return 200, OK, json.dumps({"job_id": path.split("/")[3]}).encode()
        if path.startswith(f"/v1/sessions/{session}"):
            record = {"session_id": session, "owner": "default", "created_at": 1.0}
            return 200, OK, json.dumps(record).encode()
        return NOT_FOUND

    return FakeNode(port, name, handler=handler, control_slots=2)


def test_a_job_id_two_nodes_claim_in_a_look_up_is_bound_to_neither(router: RouterProcess):
    job = str(uuid.uuid4())

    async def scenario() -> list:
        seen: list = []
        nodes = [claiming_node(router.port, n, job, str(uuid.uuid4()), seen) for n in "ab"]
        for node in nodes:
            await node.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
        for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/result"):
            answer = await http_request(router.port, "GET", path)
            assert answer.status == 404 and answer.json()["error"]["kind"] == "not_found"
        cancel = await http_request(router.port, "DELETE", f"/v1/jobs/{job}")
        assert cancel.status == 404
        # a job only one node claims is found on it, as before
        own = await http_request(router.port, "GET", "/v1/jobs/job-a/result")
        assert own.status == 200 and own.header("X-KCoral-Node") == "a"
        for node in nodes:
            await node.close()
        return seen

    seen = asyncio.run(scenario())
    # each node saw only the look-ups, never the owner's read or cancel
    assert {(m, p) for _, m, p in seen if job in p} == {("GET", f"/v1/jobs/{job}")}
    assert "job_claimed_twice" in router.wait_log("job_claimed_twice")


def test_an_id_two_nodes_list_is_left_out_of_the_merged_list_and_bound_to_neither(
    router: RouterProcess,
):
    job, session = str(uuid.uuid4()), str(uuid.uuid4())

    async def scenario() -> list:
        seen: list = []
        nodes = [claiming_node(router.port, n, job, session, seen) for n in ("honest", "rogue")]
        for node in nodes:
            await node.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
        jobs = await http_request(router.port, "GET", "/v1/jobs")
        assert jobs.status == 200
        assert sorted(j["job_id"] for j in jobs.json()) == ["job-honest", "job-rogue"]
        sessions = await http_request(router.port, "GET", "/v1/sessions")
        assert sessions.status == 200 and sessions.json() == []
        # the lists bound nothing: the owner's program and result reach neither node
        program = await http_request(
            router.port, "POST", f"/v1/sessions/{session}/execute", b'{"secret": 1}'
        )
        assert program.status == 404
        result = await http_request(router.port, "GET", f"/v1/jobs/{job}/result")
        assert result.status == 404
        for node in nodes:
            await node.close()
        return seen

    seen = asyncio.run(scenario())
    assert not [s for s in seen if s[2].endswith(("/execute", "/result")) and "job-" not in s[2]]
    log = router.wait_log("session_claimed_twice")
    assert "job_claimed_twice" in log and "session_claimed_twice" in log


def test_a_bound_job_stays_listed_from_its_node_when_a_rogue_lists_it_too(
    router: RouterProcess,
):
    async def scenario() -> None:
        seen: list = []
        submitted_id: list[str] = []

        async def honest(head: pb.RequestHead, body: bytes):
            method, path = target(head)
            if (method, path) == ("POST", "/v1/jobs"):
                job = str(uuid.uuid4())
                submitted_id.append(job)
                return 202, OK, json.dumps({"job_id": job}).encode()
            if path == "/v1/jobs":
                return 200, OK, json.dumps([{"job_id": j} for j in submitted_id]).encode()
            return NOT_FOUND

        good = FakeNode(router.port, "good", handler=honest, control_slots=2)
        await good.start()
        await wait_for_health(router.port, lambda b: b["status"] == "ok")
        submitted = await http_request(router.port, "POST", "/v1/jobs", b"{}")
        assert submitted.status == 202  # the router binds the job to "good"
        rogue = claiming_node(router.port, "rogue", submitted_id[0], str(uuid.uuid4()), seen)
        await rogue.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
        listed = await http_request(router.port, "GET", "/v1/jobs")
        assert sorted(j["job_id"] for j in listed.json()) == sorted([*submitted_id, "job-rogue"])
        mine = [j for j in listed.json() if j["job_id"] == submitted_id[0]]
        assert "submitted_at" not in mine[0]  # good's record, not the rogue's copy
        await rogue.close()
        await good.close()

    asyncio.run(scenario())
