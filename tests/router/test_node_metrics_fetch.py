"""The node supervisor's reads of its child's ``/metrics`` (``kcoral_server.node.metrics_fetch``,
ROUTER §4.6), against a real HTTP server on loopback playing the child: the router secret is
presented, a text goes into one status only, reads wait their interval, and a text past the
bound is not sent and is logged once: a text without series goes instead, so the router
drops the node's last one."""

from __future__ import annotations

import asyncio
import io

from kcoral_server.metrics.node_relay import (
    MAX_NODE_METRICS_BYTES,
    LiveNode,
    NodeRelay,
    parse_node_metrics,
)
from kcoral_server.node.metrics_fetch import NO_SERIES, MetricsReader
from kcoral_server.router.log import RouterLog
from kcoral_server.settings.command_line import SupervisorOptions

SECRET = "router-secret-for-tests"


class Child:
    """A loopback HTTP server answering ``GET /metrics`` with ``body``; it keeps each
    request's head."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.heads: list[bytes] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.heads.append(await reader.readuntil(b"\r\n\r\n"))
        authorized = f"Authorization: Bearer {SECRET}".encode() in self.heads[-1]
        status, body = (b"200 OK", self.body) if authorized else (b"401 Unauthorized", b"")
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    def stop(self) -> None:
        self.server.close()


def reader(interval: float) -> tuple[MetricsReader, io.StringIO]:
    lines = io.StringIO()
    options = SupervisorOptions(metrics_interval_seconds=interval)
    return MetricsReader(options, ("127.0.0.1", None), RouterLog(lines)), lines


def test_a_text_goes_into_one_status_and_the_next_read_waits_its_interval() -> None:
    async def scenario() -> None:
        child = Child(b"# TYPE kcoral_queue_depth gauge\nkcoral_queue_depth 0.0\n")
        url = await child.start()
        try:
            metrics, _ = reader(3600)
            await metrics.refresh(url, SECRET)
            assert metrics.take() == child.body
            assert metrics.take() == b""
            await metrics.refresh(url, SECRET)  # not due yet: no request
            assert len(child.heads) == 1 and metrics.take() == b""
            metrics.restart()  # a new child is read at its first healthy probe
            await metrics.refresh(url, SECRET)
            assert len(child.heads) == 2 and metrics.take() == child.body
        finally:
            child.stop()

    asyncio.run(scenario())


def test_a_text_past_the_bound_or_a_refusal_is_not_sent_and_is_logged_once() -> None:
    async def scenario() -> None:
        child = Child(b"#" * (MAX_NODE_METRICS_BYTES + 1))
        url = await child.start()
        try:
            metrics, lines = reader(1e-9)  # due at every probe
            for secret in (SECRET, SECRET, "not-the-secret"):
                await metrics.refresh(url, secret)
                assert metrics.take() == NO_SERIES
            assert len(child.heads) == 3
            assert lines.getvalue().count("node_metrics_unavailable") == 1
            child.body = b"kcoral_queue_depth 0.0\n"
            await metrics.refresh(url, SECRET)
            assert metrics.take() == child.body
        finally:
            child.stop()

    asyncio.run(scenario())


def test_a_read_that_fails_after_a_good_one_takes_the_nodes_series_off_the_router() -> None:
    """Before, a failed read sent nothing, which the router reads as "nothing new": it
    showed the last text (a queue of 3 here) for as long as the reads kept failing."""

    async def scenario() -> tuple[bytes, bytes]:
        child = Child(b"# TYPE kcoral_queue_depth gauge\nkcoral_queue_depth 3.0\n")
        url = await child.start()
        try:
            metrics, _ = reader(1e-9)  # due at every probe
            await metrics.refresh(url, SECRET)
            good = metrics.take()
            child.body = b"#" * (MAX_NODE_METRICS_BYTES + 1)  # the child's text outgrew the bound
            await metrics.refresh(url, SECRET)
            return good, metrics.take()
        finally:
            child.stop()

    good, after_failure = asyncio.run(scenario())
    relay, node = NodeRelay(), LiveNode("n1", "i1", "n1", "cpu")
    relay.keep("n1", "i1", parse_node_metrics(good), 0.0, ["n1"])
    assert [s.value for m in relay.collect([node]) for s in m.samples] == [3.0]
    assert after_failure, "sent nothing: the router keeps the last text"
    relay.keep("n1", "i1", parse_node_metrics(after_failure), 10.0, ["n1"])
    assert list(relay.collect([node])) == []


def test_metrics_off_reads_nothing() -> None:
    async def scenario() -> None:
        child = Child(b"kcoral_queue_depth 0.0\n")
        url = await child.start()
        try:
            metrics, _ = reader(0)
            await metrics.refresh(url, SECRET)
            assert metrics.take() == b"" and child.heads == []
        finally:
            child.stop()

    asyncio.run(scenario())
