"""The node supervisor's status stream (ROUTER §4.2, §12) against a real router: a change
reported while the stream is still waiting for the router's ack goes out at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kcoral_server.node import status_stream
from kcoral_server.node.status_stream import stream_status
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.log import RouterLog
from kcoral_server.router.nodes.registry import SERVER_STOPPED
from kcoral_server.settings.config import ServerConfig
from router_helpers import RouterProcess

INTERVAL = 30.0  # the health interval: far longer than the test waits


def test_a_change_reported_before_the_routers_ack_is_sent_at_once_not_an_interval_later(
    router: RouterProcess,
) -> None:
    """The supervisor starts its child (with a fresh slot key) while its first status is on
    its way, and reports. That report was dropped when the ack came (the loop cleared the
    event before waiting), so the router learnt the new key only at the next interval: the
    child's slots, opened in between, were refused (``slot_refused`` WARNINGs, seen at about
    half the node starts of a soak) and reconnected with back-off."""
    config = ServerConfig(router_endpoint=router.url, node_id="n1")
    changed = asyncio.Event()
    sent: list[float] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def status() -> pb.SupervisorStatus:
            sent.append(loop.time())
            if len(sent) == 1:
                loop.call_soon(changed.set)  # a report while the ack is on its way
            return pb.SupervisorStatus(
                node_id="n1",
                supervisor_instance_id="supervisor-1",
                last_error="KCoral Server is starting",
                health_age_millis=2**64 - 1,
            )

        reporter = loop.create_task(
            stream_status(
                config, status, changed, interval=INTERVAL, done=lambda: False, log=RouterLog()
            )
        )
        deadline = loop.time() + 10
        while len(sent) < 2 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)

    asyncio.run(scenario())
    assert len(sent) >= 2, "the reported change was not sent within 10 s"
    assert sent[1] - sent[0] < 5
    assert "node_connected node=n1" in router.wait_log("node_connected node=n1")


class RecordedCall:
    """The real supervisor call, noting whether the router had ended it when it was
    cancelled."""

    def __init__(self, call: Any, cancels: list[bool]) -> None:
        self.call = call
        self.cancels = cancels

    def __getattr__(self, name: str) -> Any:
        return getattr(self.call, name)

    def cancel(self) -> bool:
        self.cancels.append(self.call.done())
        return bool(self.call.cancel())


def test_a_drained_nodes_last_status_reaches_the_router_before_its_call_is_cancelled(
    router: RouterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last status (draining, ``KCoral Server has stopped``) was written, the writing
    half closed and the call cancelled at once: the router could lose that status with the
    cancel and log the planned leave as a lost node's ``node_disconnected`` WARNING (seen
    for one Slurm node job of two drained by its time limit)."""
    cancels: list[bool] = []
    real_stub = status_stream.pb_grpc.RouterGatewayStub

    class Stub:
        def __init__(self, channel: Any) -> None:
            self.stub = real_stub(channel)

        def ConnectSupervisor(self, **kwargs: Any) -> RecordedCall:
            return RecordedCall(self.stub.ConnectSupervisor(**kwargs), cancels)

    monkeypatch.setattr(status_stream.pb_grpc, "RouterGatewayStub", Stub)
    config = ServerConfig(router_endpoint=router.url, node_id="n2")
    changed = asyncio.Event()
    stopped = [False]

    def status() -> pb.SupervisorStatus:
        return pb.SupervisorStatus(
            node_id="n2",
            supervisor_instance_id="supervisor-2",
            last_error=SERVER_STOPPED if stopped[0] else "KCoral Server is shutting down",
            draining=True,
            health_age_millis=2**64 - 1,
        )

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        reporter = loop.create_task(
            stream_status(
                config, status, changed, interval=INTERVAL, done=lambda: stopped[0], log=RouterLog()
            )
        )
        await asyncio.to_thread(router.wait_log, "node_connected node=n2")
        stopped[0] = True
        changed.set()
        await asyncio.wait_for(reporter, 10)

    asyncio.run(scenario())
    assert cancels == [True], "the call was cancelled before the router had ended it"
    log = router.wait_log("node_disconnected node=n2")
    assert "INFO    node_disconnected node=n2" in log, log
