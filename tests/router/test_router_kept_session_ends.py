"""An end of a session kept while no node knew it (a restarted router's grace, ROUTER §13) is
carried out when the session's node lists it; its caller was answered ``410`` long before, so
what the node answers that ``DELETE`` is said in the router's log, WARNING
``kept_session_end_failed`` with the node's status and message, where it was dropped: a
refusal left the session running, unseen, until its idle timeout. A real router and a fake
node that refuses the end."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import FakeNode, http_request, start_router, wait_for_health

OK = [(b"content-type", b"application/json")]


def test_a_kept_end_that_its_node_refuses_is_logged_with_the_nodes_answer(
    tmp_path: Path,
) -> None:
    session_id = str(uuid.uuid4())
    router = start_router(tmp_path, "--reconnect-grace-seconds", "600")

    async def refusing(head: pb.RequestHead, body: bytes):
        method = next(h.value for h in head.headers if h.name == b":method")
        if method == b"GET":  # the listing: it holds the session
            record = {"session_id": session_id, "owner": "default", "created_at": 1.0}
            return 200, OK, json.dumps([record]).encode()
        refusal = {"kind": "conflict", "message": "cannot end it now\x1b[2J"}
        return 409, OK, json.dumps({"status": "ERROR", "error": refusal}).encode()

    async def scenario() -> int:
        kept = await http_request(router.port, "DELETE", f"/v1/sessions/{session_id}")
        node = FakeNode(router.port, "n1", handler=refusing, control_slots=2)
        await node.start()
        try:
            await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 1)
            failed = f"kept_session_end_failed node=n1 session={session_id}"
            assert failed in await asyncio.to_thread(router.wait_log, failed, 60)
        finally:
            await node.close()
        return kept.status

    try:
        assert asyncio.run(scenario()) == 410
    finally:
        router.stop()
    line = next(x for x in router.log().splitlines() if "kept_session_end_failed" in x)
    assert line.split(" ", 1)[1].startswith("WARNING")
    assert line.endswith("http_status=409 error='cannot end it now\\x1b[2J'")
