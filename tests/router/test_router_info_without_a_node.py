"""``GET /v1/info`` of a router none of whose nodes is ready (ROUTER §7, §13): answered
503 ``no_node`` within seconds, saying where to look, as an operator's ``curl`` in the
scaling guide's run-through expects. Before, it waited the whole
``--queue-wait-timeout-seconds`` (30 minutes by default) with nothing said."""

from __future__ import annotations

import asyncio

from router_helpers import FakeNode, http_request, wait_for_health

NO_READY_NODE = "no node is ready (the router's /health says when one is, its log why not)"


def test_info_of_a_router_without_a_ready_node_is_a_503_that_says_so(router) -> None:
    async def scenario() -> None:
        # the client gives up long before the router's 1800 s queue wait would end
        answer = await asyncio.wait_for(http_request(router.port, "GET", "/v1/info"), 60)
        assert answer.status == 503, answer.body
        assert answer.json()["error"] == {"kind": "no_node", "message": NO_READY_NODE}
        # once a node is ready, the same request is answered by it
        node = FakeNode(router.port, "n1", control_slots=1)
        await node.start()
        try:
            await wait_for_health(router.port, lambda b: b["status"] == "ok")
            again = await http_request(router.port, "GET", "/v1/info")
            assert again.status != 503, again.body
        finally:
            await node.close()

    asyncio.run(scenario())
