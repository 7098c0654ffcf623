"""The node supervisor's status stream (ROUTER §4.2, §12) against a real router: a change
reported while the stream is still waiting for the router's ack goes out at once."""

from __future__ import annotations

import asyncio

from kcoral_server.node.status_stream import stream_status
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.log import RouterLog
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
