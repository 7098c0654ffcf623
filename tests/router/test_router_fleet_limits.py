"""A router's ``/v1/info`` says the largest request body it passes on that some ready node may
take, ``fleet_limits`` (ROUTER §13), so a client can hold back a larger body instead of sending
it to be refused (CLIENT_API §2.1 step 11). Before, it had only ``limits``, one node's, which the
client rightly ignored for a router. The router's own ``--max-request-bytes`` bounds it; where
every ready node stated a smaller limit, the largest of theirs does, so a rogue node stating a
tiny one holds back nothing another node takes. A real router with a real CPU node, and fake
nodes for the rogue's claims."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from router_helpers import (
    FakeNode,
    RouterProcess,
    http_request,
    router_with_a_node,
    start_router,
    wait_for_health,
)

import kcoral

TOKEN = "fleet-limits-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "fleet-limits-node-token"}
OK = [(b"content-type", b"application/json")]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("fleet-limits")
    with router_with_a_node(
        tmp, f"alice {TOKEN}\n", NODE_ENV, "--max-request-bytes", "1M", node_id="small"
    ) as router:
        yield router


@pytest.mark.slow
def test_a_routers_info_states_its_only_nodes_smaller_limit_as_the_fleets(
    router: RouterProcess,
) -> None:
    with kcoral.Client(router.url, token=TOKEN) as client:
        info = client.info()
        over = kcoral.Program()
        over.return_(key="b", value=over.upload(kind="bytes", value=bytes(1 << 20)))
        with pytest.raises(kcoral.KCoralError) as refused:  # true: such a body is refused
            client.execute(over, timeout_seconds=30)
    assert info["limits"]["max_request_bytes"] == 1 << 20  # the node's own
    assert info["fleet_limits"] == {"max_request_bytes": 1 << 20, "set_by": "nodes"}
    assert (refused.value.status_code, refused.value.kind) == (413, "request_too_large")


def limits_node(port: int, name: str, limit: object) -> FakeNode:
    """A fake node whose ``/v1/info`` states ``limit`` as its ``max_request_bytes`` (None:
    no limit at all) and offers no free session seat."""

    async def handler(head: pb.RequestHead, body: bytes):
        info: dict = {"features": ["sessions"], "sessions": {"max": 1, "active": 1}}
        if limit is not None:
            info["limits"] = {"max_request_bytes": limit}
        return 200, OK, json.dumps(info).encode()

    return FakeNode(port, name, handler=handler, control_slots=2)


async def fleet_limits_after_every_node_answered(port: int) -> dict:
    """``fleet_limits`` once the router has read every ready node's ``/v1/info``: a session's
    choice of node asks each of them."""
    chosen = await http_request(port, "POST", "/v1/sessions", b"{}")
    assert chosen.status == 503 and chosen.json()["error"]["kind"] == "busy", chosen.body
    answer = await http_request(port, "GET", "/v1/info")
    assert answer.status == 200, answer.body
    return answer.json()["fleet_limits"]


@pytest.mark.parametrize(
    ("rogue_says", "expected"),
    [
        (1, {"max_request_bytes": 4096, "set_by": "nodes"}),
        (None, {"max_request_bytes": 1 << 20, "set_by": "router"}),
        ("1", {"max_request_bytes": 1 << 20, "set_by": "router"}),
        (True, {"max_request_bytes": 1 << 20, "set_by": "router"}),
        (10**30, {"max_request_bytes": 1 << 20, "set_by": "router"}),
    ],
)
def test_a_rogue_nodes_stated_limit_holds_back_no_body_another_node_takes(
    tmp_path: Path, rogue_says: object, expected: dict
) -> None:
    router = start_router(tmp_path, "--max-request-bytes", "1M", "--reconnect-grace-seconds", "0")

    async def scenario() -> dict:
        nodes = [limits_node(router.port, "rogue", rogue_says)]
        nodes.append(limits_node(router.port, "honest", 4096))
        for node in nodes:
            await node.start()
        try:
            await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 2)
            return await fleet_limits_after_every_node_answered(router.port)
        finally:
            for node in nodes:
                await node.close()

    try:
        assert asyncio.run(scenario()) == expected
    finally:
        router.stop()


def test_a_router_whose_own_limit_is_smaller_than_its_nodes_states_its_own(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--max-request-bytes", "4096", "--reconnect-grace-seconds", "0")

    async def scenario() -> dict:
        node = limits_node(router.port, "big", 1 << 20)
        await node.start()
        try:
            await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 1)
            return await fleet_limits_after_every_node_answered(router.port)
        finally:
            await node.close()

    try:
        assert asyncio.run(scenario()) == {"max_request_bytes": 4096, "set_by": "router"}
    finally:
        router.stop()
