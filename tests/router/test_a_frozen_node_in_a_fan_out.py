"""A node that never answers the router's fan-out (frozen, or a rogue holding it on purpose)
does not fail a client's status read through the router: ``client.jobs()`` (and a job
look-up, a session list) answers within the client's 30 s for a status read (CLIENT_API
§1), with what the other nodes hold. The router waited up to 10 s for the node's control
slot and 30 s for its answer, so it answered after the client had given up: ``jobs()``
raised 'cannot reach URL: no answer within 30.0 s (read timeout)' of a router that was
there, whenever one node of the fleet hung. A real router with fake nodes."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import FakeNode, RouterProcess, wait_for_health

import kcoral

pytestmark = pytest.mark.slow

OK = [(b"content-type", b"application/json")]


def path_of(head: pb.RequestHead) -> str:
    named = {h.name.decode(): h.value.decode() for h in head.headers}
    return named.get(":path", "")


def honest_node(job_id: str) -> FakeNode:
    """A node holding one job of the caller's."""

    async def handler(head: pb.RequestHead, body: bytes):
        if path_of(head).startswith("/v1/jobs"):
            record = {"job_id": job_id, "status": "RUNNING", "submitted_at": None}
            return 200, OK, json.dumps([record]).encode()
        return 200, OK, b"{}"

    return FakeNode(0, "honest", handler=handler, control_slots=2)


def frozen_node() -> FakeNode:
    """A node that takes the router's list request and never answers it."""

    async def handler(head: pb.RequestHead, body: bytes):
        if path_of(head).startswith("/v1/jobs"):
            await asyncio.Event().wait()
        return 200, OK, b"{}"

    return FakeNode(0, "frozen", handler=handler, control_slots=2)


def test_a_node_that_never_answers_a_list_leaves_the_clients_job_list_whole_of_the_rest(
    router: RouterProcess,
) -> None:
    job_id = str(uuid.uuid4())
    nodes = [honest_node(job_id), frozen_node()]

    async def scenario() -> list:
        for node in nodes:
            node.router_port = router.port
            await node.start()
        try:
            await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
            with kcoral.Client(router.url) as client:
                return await asyncio.to_thread(client.jobs)
        finally:
            for node in nodes:
                await node.close()

    listed = asyncio.run(scenario())
    assert [job["job_id"] for job in listed] == [job_id]
