"""What a node supervisor's ``supervisor_disconnected`` line says (ROUTER §12): why its
status stream ended, never grpc's bare 'RPC already finished.'; and a supervisor started
beside its router (before the router listens) connects without such a line.

Before, the stream's call was opened before the channel was up. Started beside its router
(a machine's boot, a pod beside the router's), the call failed at once, and the first write
once the router listened said 'RPC already finished.' in a WARNING, a second before the
reconnect. A router that stopped gave the same words, where the line now says that the router
ended the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
from pathlib import Path
from typing import Any

from kcoral_server.node.status_stream import stream_status
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.log import RouterLog
from kcoral_server.settings.config import ServerConfig
from router_helpers import RouterProcess, start_router

INTERVAL = 0.2  # the health interval: a status every 0.2 s notices an ended stream soon
GRPC_WORDS = "RPC already finished"


def _status() -> pb.SupervisorStatus:
    return pb.SupervisorStatus(
        node_id="n1",
        supervisor_instance_id="supervisor-1",
        last_error="KCoral Server is starting",
        health_age_millis=2**64 - 1,
    )


class Reporter:
    """``stream_status`` of node ``n1`` to ``endpoint``, run in this process, with the
    events it logs."""

    def __init__(self, endpoint: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        log = RouterLog(io.StringIO())
        log.add_listener(lambda event, fields: self.events.append((event, dict(fields))))
        self.config = ServerConfig(router_endpoint=endpoint, node_id="n1")
        self.log = log

    def start(self) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(
            stream_status(
                self.config,
                _status,
                asyncio.Event(),
                interval=INTERVAL,
                done=lambda: False,
                log=self.log,
            )
        )

    async def until(self, event: str) -> dict[str, Any]:
        """The first ``event`` logged (a hang guard of 30 s, not a timing check)."""
        for _ in range(600):
            for name, fields in self.events:
                if name == event:
                    return fields
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {event} within 30 s: {self.events}")

    def disconnections(self) -> list[str]:
        return [str(f.get("error")) for name, f in self.events if name == "supervisor_disconnected"]


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_router_that_stops_is_named_as_the_streams_end(tmp_path: Path) -> None:
    router = start_router(tmp_path)

    async def scenario() -> str:
        reporter = Reporter(router.url)
        task = reporter.start()
        try:
            await reporter.until("supervisor_connected")
            await asyncio.to_thread(router.stop)
            return str((await reporter.until("supervisor_disconnected"))["error"])
        finally:
            await _stop(task)

    try:
        error = asyncio.run(scenario())
    finally:
        router.stop()
    assert GRPC_WORDS not in error
    assert error == "the router ended the supervisor stream" or error.startswith("UNAVAILABLE")


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


def test_a_supervisor_started_before_its_router_listens_connects_without_grpc_words(
    tmp_path: Path,
) -> None:
    """A loopback relay in front of the router plays a router still starting: it hangs up
    on the first connection (as a port nobody listens on refuses it), then relays."""
    router: RouterProcess = start_router(tmp_path)

    async def scenario() -> list[str]:
        hung_up = asyncio.Event()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if not hung_up.is_set():
                hung_up.set()
                writer.transport.abort()
                return
            upstream = await asyncio.open_connection("127.0.0.1", router.port)
            await asyncio.gather(_relay(reader, upstream[1]), _relay(upstream[0], writer))

        listening = socket.create_server(("127.0.0.1", 0))
        relay = await asyncio.start_server(accept, sock=listening)
        port = listening.getsockname()[1]
        reporter = Reporter(f"http://127.0.0.1:{port}")
        task = reporter.start()
        try:
            await reporter.until("supervisor_connected")
            assert hung_up.is_set(), "the relay never hung up: nothing was tested"
            return reporter.disconnections()
        finally:
            await _stop(task)
            relay.close()

    try:
        disconnections = asyncio.run(scenario())
    finally:
        router.stop()
    assert not [error for error in disconnections if GRPC_WORDS in error], disconnections
