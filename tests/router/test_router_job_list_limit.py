"""A router's ``GET /v1/jobs`` holds at most ``?limit=N`` jobs, the newest of every node's,
says how many it left out, and names the nodes whose list it could not read (EXTENSIONS §5,
ROUTER §13). Before, the merge held every job of every node, and a node whose list it could
not read (over the 64 MiB it fetches, say) was left out without a word."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs, urlsplit

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import FakeNode, RouterProcess, http_request, wait_for_health

OK = [(b"content-type", b"application/json")]
#: node a: three jobs, and it honours ``limit``; node b: two, and lists all of them (a
#: server of the published protocol); minute m of the hour is a job's age order
JOBS = {"a": {"a1": 1, "a2": 3, "a3": 5}, "b": {"b1": 2, "b2": 4}}


def _record(job_id: str, minute: int) -> dict[str, str]:
    return {"job_id": job_id, "submitted_at": f"2026-01-05T09:{minute:02d}:00.000001Z"}


def listing_node(port: int, name: str, asked: list[str]) -> FakeNode:
    async def handler(head: pb.RequestHead, body: bytes):
        pseudo = {h.name: h.value.decode() for h in head.headers if h.name.startswith(b":")}
        target = urlsplit(pseudo[b":path"])
        if target.path != "/v1/jobs":
            return 404, OK, b'{"status":"ERROR","error":{"kind":"not_found","message":"no"}}'
        asked.append(f"{name} {pseudo[b':path']}")
        if name == "c":
            return 200, OK, b"[not json"
        jobs = sorted(JOBS[name].items(), key=lambda item: -item[1])
        if name == "b":
            return 200, OK, json.dumps([_record(*job) for job in jobs]).encode()
        limit = int(parse_qs(target.query).get("limit", ["1000"])[0])
        left_out = str(max(0, len(jobs) - limit)).encode()
        listed = json.dumps([_record(*job) for job in jobs[:limit]]).encode()
        return 200, [*OK, (b"x-kcoral-jobs-left-out", left_out)], listed

    return FakeNode(port, name, handler=handler, control_slots=2)


def test_a_merged_job_list_holds_the_newest_limit_and_names_what_it_left_out(
    router: RouterProcess,
) -> None:
    async def scenario() -> None:
        asked: list[str] = []
        nodes = [listing_node(router.port, name, asked) for name in "abc"]
        for node in nodes:
            await node.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 3)
        two = await http_request(router.port, "GET", "/v1/jobs?limit=2")
        assert two.status == 200
        assert [job["job_id"] for job in two.json()] == ["a3", "b2"]
        # a1 and a2 (one of them left out by a itself), b1: three in all
        assert two.header("X-KCoral-Jobs-Left-Out") == "3"
        assert two.header("X-KCoral-Nodes-Left-Out") == "c"
        assert sorted(asked) == [f"{n} /v1/jobs?limit=2" for n in "abc"]
        asked.clear()
        every = await http_request(router.port, "GET", "/v1/jobs")
        assert [job["job_id"] for job in every.json()] == ["a3", "b2", "a2", "b1", "a1"]
        assert every.header("X-KCoral-Jobs-Left-Out") == "0"
        assert every.header("X-KCoral-Nodes-Left-Out") == "c"
        assert sorted(asked) == [f"{n} /v1/jobs" for n in "abc"]  # each node's own default
        # A node that is away holds its jobs: named too, not left out without a word.
        await nodes[1].close()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] == 2)
        away = await http_request(router.port, "GET", "/v1/jobs")
        assert [job["job_id"] for job in away.json()] == ["a3", "a2", "a1"]
        assert away.header("X-KCoral-Nodes-Left-Out") == "b,c"
        refused = await http_request(router.port, "GET", "/v1/jobs?limit=0")
        assert refused.status == 400
        assert refused.json()["error"] == {
            "kind": "parse",
            "message": "limit must be an integer from 1 to 10000",
        }
        for node in nodes:
            await node.close()

    asyncio.run(scenario())
