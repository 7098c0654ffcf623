"""A holder of the node token opens worker slots under a live node's id (issue 28, point 3).

Attacker: a process that holds the node token (a copied credential, or a program on a node
machine without a sandbox) and has learnt the server instance id of a live node. Before the
fix the router took its slots on the token and the instance id alone, sent it other users'
programs with their identity and relayed its forged answers. Now the node's supervisor
announces a slot key made fresh at each child start on its own (authenticated, one per
node id) stream, and the router opens that node's slots only for a hello that carries it.
Each test runs a real ``kcoral router`` process against in-process fake nodes.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kcoral_server.node.tunnel import open_channel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from router_helpers import (
    FakeNode,
    RouterProcess,
    http_request,
    rogue_slot,
    start_router,
    wait_for_health,
)

NODE_TOKEN = "node-token-for-slot-tests"
SLOT_KEY = "slot-key-only-the-nodes-own-child-holds"


def capacity(n: int):
    return lambda body: body["load"]["request_capacity"] >= n


async def forged_answer(head: pb.RequestHead, body: bytes):
    return 500, [(b"content-type", b"text/plain")], b"FORGED BY ROGUE SLOT"


def started_router(tmp_path: Path) -> RouterProcess:
    return start_router(
        tmp_path, "--status-check-interval-seconds", "0.2", env={"KCORAL_NODE_TOKEN": NODE_TOKEN}
    )


def test_a_token_holder_who_knows_the_instance_id_but_not_the_slot_key_gets_no_slot(
    tmp_path: Path,
) -> None:
    router = started_router(tmp_path)

    async def scenario() -> None:
        real = FakeNode(router.port, "gpu-1", slots=2, token=NODE_TOKEN, slot_key=SLOT_KEY)
        await real.start()
        await wait_for_health(router.port, capacity(2))
        for key in ("", "a-guessed-key", SLOT_KEY[:-1]):
            code, received = await rogue_slot(
                router, "gpu-1", real.instance_id, token=NODE_TOKEN, slot_key=key
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED, (key, code)
            assert received == [], "the rogue slot was acknowledged or sent work"
        for _ in range(6):
            answer = await http_request(router.port, "POST", "/execute", b"alice's program")
            assert answer.status == 200 and answer.body == b"alice's program"
            assert answer.header("X-KCoral-Node") == "gpu-1"
        assert len(real.requests) == 6
        log = router.wait_log("slot_refused")
        assert "slot_refused" in log and "WARNING" in log
        assert "node_without_slot_key" not in log  # this supervisor announced its key
        await real.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_slot_opened_before_the_supervisor_announced_its_key_is_closed_and_gets_no_work(
    tmp_path: Path,
) -> None:
    router = started_router(tmp_path)

    async def scenario() -> None:
        real = FakeNode(router.port, "gpu-1", slots=1, token=NODE_TOKEN, slot_key=SLOT_KEY)
        # The rogue is there first, naming the instance the real node is about to report.
        early = asyncio.ensure_future(
            rogue_slot(router, "gpu-1", real.instance_id, token=NODE_TOKEN, slot_key="")
        )
        await asyncio.sleep(0.5)  # let its hello arrive; nothing below depends on timing
        await real.start()
        code, received = await asyncio.wait_for(early, 60)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "request_head" not in received
        await wait_for_health(router.port, capacity(1))
        for _ in range(3):
            answer = await http_request(router.port, "POST", "/execute", b"x")
            assert answer.status == 200 and answer.body == b"x"
        assert len(real.requests) == 3
        await real.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_published_supervisor_without_a_slot_key_still_connects_with_a_warning(
    tmp_path: Path,
) -> None:
    router = started_router(tmp_path)

    async def scenario() -> None:
        published = FakeNode(router.port, "old-node", slots=1, token=NODE_TOKEN)
        await published.start()
        await wait_for_health(router.port, capacity(1))
        answer = await http_request(router.port, "POST", "/execute", b"still served")
        assert answer.status == 200 and answer.body == b"still served"
        log = router.wait_log("node_without_slot_key")
        assert "node_without_slot_key" in log and "WARNING" in log
        await published.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_rogue_that_answers_never_reaches_a_client_of_a_keyed_node(tmp_path: Path) -> None:
    # The forged answer of the issue: the rogue would answer every program it received.
    router = started_router(tmp_path)

    async def scenario() -> None:
        real = FakeNode(router.port, "gpu-1", slots=1, token=NODE_TOKEN, slot_key=SLOT_KEY)
        await real.start()
        await wait_for_health(router.port, capacity(1))
        rogue = FakeNode(
            router.port,
            "gpu-1",
            token=NODE_TOKEN,
            instance_id=real.instance_id,
            handler=forged_answer,
        )
        rogue.channel = open_channel(router.url)
        rogue.stub = pb_grpc.RouterGatewayStub(rogue.channel)
        try:
            await rogue.open_slot()
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
        else:
            raise AssertionError("the rogue's slot was acknowledged")
        for _ in range(4):
            answer = await http_request(router.port, "POST", "/execute", b"program")
            assert answer.status == 200 and b"FORGED" not in answer.body
        assert rogue.requests == []
        await rogue.close()
        await real.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_node_that_opens_slot_streams_without_end_is_refused_past_its_bound(
    tmp_path: Path,
) -> None:
    # Attacker: a rogue node (its own token and slot key: a compromised node machine) that
    # opens slot streams in a loop, each holding router memory and a place in its record.
    router = start_router(
        tmp_path,
        "--status-check-interval-seconds",
        "0.2",
        "--max-slots-per-node",
        "4",
        env={"KCORAL_NODE_TOKEN": NODE_TOKEN},
    )

    async def scenario() -> None:
        real = FakeNode(router.port, "gpu-1", slots=2, token=NODE_TOKEN, slot_key=SLOT_KEY)
        rogue = FakeNode(router.port, "gpu-2", slots=4, token=NODE_TOKEN, slot_key="rogue-key")
        await real.start()
        await rogue.start()
        for _ in range(3):
            try:
                await rogue.open_slot()
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                assert "--max-slots-per-node" in (exc.details() or "")
            else:
                raise AssertionError("a slot past --max-slots-per-node was acknowledged")
        await wait_for_health(router.port, capacity(6))
        await real.open_slot()  # the bound is per node id: the real node still grows
        await wait_for_health(router.port, capacity(7))
        for _ in range(6):
            answer = await http_request(router.port, "POST", "/execute", b"program")
            assert answer.status == 200 and answer.body == b"program"
        log = router.wait_log("--max-slots-per-node")
        assert "slot_refused" in log and "gpu-2" in log
        await rogue.close()
        await real.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()
