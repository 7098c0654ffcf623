"""Test helpers: a real ``kcoral router`` subprocess, an in-process fake node speaking the
gateway protocol, and a tiny streaming HTTP client."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import tornado.httpserver
import tornado.netutil
from child_setup import under_open_file_limit
from kcoral_server.node.http11 import HttpConnection
from kcoral_server.node.tunnel import auth_metadata, open_channel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from raw_http import request
from server_process import client_token_file
from waiting import wait_for

HERE = Path(__file__).resolve().parent
#: what grpcio's asyncio client reports instead of the status a server ended a stream with
#: when the client's own write races that end: the failed write overwrites the status
#: (grpc/grpc#36066, open; seen under the suite's load as INTERNAL for UNAUTHENTICATED)
LOST_STATUS_DETAILS = "Internal error from Core"
#: attempts at a refused stream before a lost status counts as the answer
STATUS_TRIES = 5


async def stream_status(
    attempt: Callable[[], Awaitable[tuple[grpc.StatusCode | None, str]]],
) -> grpc.StatusCode | None:
    """The status code ``attempt`` (a fresh stream each time: code and details) ends with,
    tried again while the client library lost the server's status (``LOST_STATUS_DETAILS``):
    the router's answer, not the client's race with it."""
    code, details = await attempt()
    for _ in range(STATUS_TRIES - 1):
        if code is not grpc.StatusCode.INTERNAL or LOST_STATUS_DETAILS not in details:
            break
        code, details = await attempt()
    return code


#: Every router and node log a test started; conftest shows the recent ones when a test
#: fails, so a failure under CI load can be read from its report (the logs die with tmp).
STARTED_LOGS: list[Path] = []


@dataclass
class RouterProcess:
    url: str
    port: int
    process: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        """The log once it contains ``text`` (the router writes it after answering)."""
        deadline = time.monotonic() + timeout
        while text not in self.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.log()

    def lines_after_mark(self, token: str | None = None, timeout: float = 10.0) -> int:
        """How many log lines the router has written for every request answered so far: it
        writes a request's ``request_finished`` line just after the answer's bytes (a client
        can be on to its next step before it lands), so a count taken right after an answer
        can miss the line. Asks for a unique unknown path and waits for its line: the router
        logs requests in the order it finishes them, so every earlier one is in by then."""
        mark = f"/zz-log-mark-{uuid.uuid4().hex}"
        request(
            self.url, "GET", mark, headers={"Authorization": f"Bearer {token}"} if token else {}
        )
        deadline = time.monotonic() + timeout
        while True:
            lines = self.log().splitlines()
            for index, line in enumerate(lines):
                if f"path={mark} " in line:
                    return index + 1
            assert time.monotonic() < deadline, f"no log line for {mark}\n{self.log()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_router(
    tmp: Path,
    *args: str,
    env: dict[str, str] | None = None,
    open_files: tuple[int, int | None] | None = None,
) -> RouterProcess:
    """A real router on a free port; ``open_files`` (soft, hard) lowers its descriptor limit
    (``None`` for hard keeps the hard limit)."""
    ready = tmp / f"router-ready-{uuid.uuid4().hex[:6]}"
    log_path = tmp / f"router-{uuid.uuid4().hex[:6]}.log"
    STARTED_LOGS.append(log_path)
    command = [sys.executable, "-m", "kcoral", "router", "--port", "0", "--ready-file", str(ready)]
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_NODE_TOKEN"}
    environment.update(env or {})
    command += args
    if open_files is not None:
        command = under_open_file_limit(command, *open_files)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if ready.exists() and ready.read_text().strip():
            url = ready.read_text().strip()
            return RouterProcess(url, int(url.rsplit(":", 1)[1]), process, log_path)
        if process.poll() is not None:
            raise RuntimeError(f"router exited: {log_path.read_text()}")
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("router did not start")


async def rogue_slot(
    router: RouterProcess, node_id: str, instance_id: str, *, token: str, slot_key: str
) -> tuple[grpc.StatusCode, list[str]]:
    """A slot a rogue opens under ``node_id`` with ``token`` and ``slot_key``: the status
    its stream ends with and the payload kinds of the frames it received meanwhile."""
    channel = open_channel(router.url)
    received: list[str] = []
    try:
        call = pb_grpc.RouterGatewayStub(channel).ConnectSlot(metadata=auth_metadata(token))
        hello = pb.SlotHello(
            node_id=node_id,
            server_instance_id=instance_id,
            slot_id=str(uuid.uuid4()),
            protocol_version=1,
            slot_key=slot_key,
        )
        try:
            await call.write(pb.SlotFrame(hello=hello))
            while True:
                frame = await asyncio.wait_for(call.read(), 30)
                if frame is grpc.aio.EOF:
                    break
                received.append(frame.WhichOneof("payload"))
        except grpc.aio.AioRpcError as exc:
            return exc.code(), received
        return await call.code(), received
    finally:
        await channel.close()


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for n, v in self.headers if n.lower() == name.lower()]
        return values[0] if values else None

    def headers_named(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name.lower()]

    def json(self) -> Any:
        return json.loads(self.body)


async def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: list[tuple[str, str]] | None = None,
    *,
    chunks: list[bytes] | None = None,
) -> Response:
    """One request on a fresh connection; ``chunks`` sends a chunked body."""
    connection = HttpConnection("127.0.0.1", port)
    await connection.open()
    try:
        head = [(b"Host", f"127.0.0.1:{port}".encode())]
        head += [(n.encode(), v.encode()) for n, v in headers or []]
        if chunks is not None:
            head.append((b"Transfer-Encoding", b"chunked"))
        elif body is not None and not any(n.lower() == "content-length" for n, _ in headers or []):
            head.append((b"Content-Length", str(len(body)).encode()))
        await connection.send_head(method, path, head)
        if chunks is not None:
            for chunk in chunks:
                await connection.send(chunk, chunked=True)
            await connection.send_end(chunked=True)
        elif body:
            await connection.send(body, chunked=False)
        status, raw = await connection.read_head()
        data = b"".join([p async for p in connection.body(status, raw, method)])
        return Response(status, [(n.decode(), v.decode("latin-1")) for n, v in raw], data)
    finally:
        connection.close()


Handler = Callable[[pb.RequestHead, bytes], Awaitable[tuple[int, list[tuple[bytes, bytes]], bytes]]]


async def echo_handler(
    head: pb.RequestHead, body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    return 200, [(b"content-type", b"application/octet-stream")], body


@dataclass
class FakeNode:
    """A node that answers slot requests in-process with ``handler``."""

    router_port: int
    node_id: str
    slots: int = 1
    control_slots: int = 0
    token: str | None = None
    versions: dict[str, str] = field(default_factory=lambda: {"python": "3"})
    handler: Handler = echo_handler
    healthy: bool = True
    instance_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    supervisor_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    cancels: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    heads: list[pb.RequestHead] = field(default_factory=list)  # as the node received them
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    busy: int = 0
    # The key announced on the supervisor stream and presented in every hello (ROUTER §12);
    # "" plays a published supervisor, which announces none.
    slot_key: str = ""

    def status(self) -> pb.SupervisorStatus:
        status = pb.SupervisorStatus(
            node_id=self.node_id,
            server_healthy=self.healthy,
            supervisor_instance_id=self.supervisor_id,
            server_instance_id=self.instance_id if self.healthy else "",
            worker_count=self.slots if self.healthy else 0,
            busy_workers=min(self.busy, self.slots) if self.healthy else 0,
            health_age_millis=10 if self.healthy else 2**64 - 1,
            last_error="" if self.healthy else "down",
            slot_key=self.slot_key,
        )
        status.versions.update(self.versions)
        return status

    async def start(self) -> None:
        self.channel = open_channel(f"http://127.0.0.1:{self.router_port}")
        self.stub = pb_grpc.RouterGatewayStub(self.channel)
        self.supervisor = self.stub.ConnectSupervisor(metadata=auth_metadata(self.token))
        await self.supervisor.write(self.status())
        ack = await asyncio.wait_for(self.supervisor.read(), 5)
        assert ack is not grpc.aio.EOF
        loop = asyncio.get_running_loop()
        self.tasks.append(loop.create_task(self._report()))
        for _ in range(self.slots):
            await self.open_slot()
        for _ in range(self.control_slots):
            await self.open_slot("control")

    async def open_slot(self, kind: str = "worker") -> Any:
        metadata = auth_metadata(self.token)
        if kind != "worker":
            metadata = (*metadata, ("kcoral-slot-kind", kind))
        call = self.stub.ConnectSlot(metadata=metadata)
        hello = pb.SlotHello(
            node_id=self.node_id,
            server_instance_id=self.instance_id,
            slot_id=str(uuid.uuid4()),
            protocol_version=1,
            slot_key=self.slot_key,
        )
        await call.write(pb.SlotFrame(hello=hello))
        ack = await asyncio.wait_for(call.read(), 5)
        assert ack.WhichOneof("payload") == "ack"
        self.tasks.append(asyncio.get_running_loop().create_task(self._serve(call, kind)))
        return call

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(0.3)
            await self.supervisor.write(self.status())

    async def _serve(self, call: Any, slot_kind: str = "worker") -> None:
        pending: asyncio.Task[Any] | None = None

        async def next_frame() -> Any:
            nonlocal pending
            task = pending or asyncio.ensure_future(call.read())
            pending = None
            return await task

        try:
            while True:
                frame = await next_frame()
                if frame is grpc.aio.EOF:
                    return
                kind = frame.WhichOneof("payload")
                if kind == "cancel":
                    self.cancels.append(frame.cancel.reason)
                    await self.open_slot(slot_kind)  # a cancelled slot is replaced at once
                    return
                assert kind == "request_head", kind
                rid, head, parts = frame.request_id, frame.request_head, []
                self.requests.append(rid)
                self.heads.append(head)
                while True:
                    frame = await next_frame()
                    if frame is grpc.aio.EOF:
                        return
                    kind = frame.WhichOneof("payload")
                    if kind == "cancel":
                        self.cancels.append(frame.cancel.reason)
                        await self.open_slot(slot_kind)
                        return
                    assert frame.request_id == rid
                    if kind == "end":
                        break
                    assert len(frame.data) <= 262144
                    parts.append(frame.data)
                self.busy += 1
                work = asyncio.ensure_future(self.handler(head, b"".join(parts)))
                pending = asyncio.ensure_future(call.read())
                await asyncio.wait({work, pending}, return_when=asyncio.FIRST_COMPLETED)
                self.busy -= 1
                if not work.done():
                    work.cancel()
                    frame = await next_frame()
                    if frame is not grpc.aio.EOF and frame.WhichOneof("payload") == "cancel":
                        self.cancels.append(frame.cancel.reason)
                        await self.open_slot(slot_kind)
                    return
                status, headers, body = work.result()
                response_head = pb.ResponseHead(
                    status=status, headers=[pb.HttpHeader(name=n, value=v) for n, v in headers]
                )
                await call.write(pb.SlotFrame(request_id=rid, response_head=response_head))
                for start in range(0, len(body), 262144):
                    await call.write(
                        pb.SlotFrame(request_id=rid, data=body[start : start + 262144])
                    )
                await call.write(pb.SlotFrame(request_id=rid, end=pb.EndOfBody()))
        except grpc.RpcError:
            await self._note_cancel(pending)
        except asyncio.CancelledError:
            return
        finally:
            if pending is not None:
                pending.cancel()

    async def _note_cancel(self, pending: asyncio.Future[Any] | None) -> None:
        """The router cancels a slot whose answer it refuses (invalid) and closes it, maybe
        while this node still writes that answer: the write fails, and the cancel frame
        waits in the read under way."""
        if pending is None:
            return
        try:
            frame = await asyncio.wait_for(asyncio.shield(pending), 2)
        except (grpc.RpcError, asyncio.TimeoutError):
            return
        if frame is not grpc.aio.EOF and frame.WhichOneof("payload") == "cancel":
            self.cancels.append(frame.cancel.reason)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.channel.close()


async def wait_for_health(
    port: int, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20
) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = (await http_request(port, "GET", "/health")).json()
        if predicate(body):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"health never matched: {body}")
        await asyncio.sleep(0.05)


# -- real nodes (supervisor + CPU server child) ------------------------------------------


def node_command(tmp: Path, router_url: str, node_id: str, *extra: str) -> list[str]:
    server_args = [
        "--router",
        router_url,
        "--node-id",
        node_id,
        "--device",
        "cpu",
        "--port",
        "0",
        "--sandbox",
        "none",
        "--log-dir",
        "",
        "--disk-cache-dir",
        str(tmp / f"cache-{node_id}"),
        "--max-requests-per-worker",
        "0",
        "--health-interval-seconds",
        "0.3",
        "--restart-min-delay-seconds",
        "0.2",
        "--startup-grace-seconds",
        "60",
        *extra,
    ]
    return [sys.executable, "-m", "kcoral", "server", *server_args]


class Node:
    def __init__(self, tmp: Path, router: RouterProcess, node_id: str, env=None, *extra: str):
        self.node_id = node_id
        self.log_path = tmp / f"node-{node_id}.log"
        STARTED_LOGS.append(self.log_path)
        environment = {k: v for k, v in os.environ.items() if k != "KCORAL_NODE_TOKEN"}
        environment.update(env or {})
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                node_command(tmp, router.url, node_id, *extra),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                cwd=str(HERE),
            )

    def server_pid(self) -> int:
        """The pid of the supervisor's current child server: the one its log last says it
        started, once it is the supervisor's live child. Not its first child: the supervisor
        is a subreaper, so an orphan it adopted is its child too, and with pids wrapping
        (32768 here) one may sort first; a test stopping "the server" stopped that orphan,
        and the server it meant answered on."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            log = self.log_path.read_text(errors="replace")
            started = re.findall(r"server_child_started node_id=\S+ pid=([0-9]+)", log)
            children = {child.pid for child in psutil.Process(self.process.pid).children()}
            if started and int(started[-1]) in children:
                return int(started[-1])
            time.sleep(0.05)
        raise AssertionError(f"no child server\n{self.log_path.read_text()}")

    def stop_server(self) -> int:
        """SIGSTOP the current child server; its pid once it is stopped (``/proc`` says so)."""
        server = self.server_pid()
        os.kill(server, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(server).status() == psutil.STATUS_STOPPED, "a stop")
        return server

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                for child in psutil.Process(self.process.pid).children(recursive=True):
                    child.kill()
                self.process.kill()
                self.process.wait()


@contextmanager
def stopping(router: RouterProcess, nodes: list[Node]) -> Iterator[None]:
    """Stops the real nodes, then their router, however the block ends."""
    try:
        yield
    finally:
        for node in nodes:
            node.stop()
        router.stop()


@contextmanager
def router_with_a_node(
    tmp: Path, tokens: str, node_env: dict[str, str], *node_args: str, node_id: str = "n1"
) -> Iterator[RouterProcess]:
    """A real router checking the client tokens of ``tokens`` (a token file's text) and one
    real CPU node of it (``node_args`` its server's own), ready; both stopped afterwards."""
    token_file = client_token_file(tmp, tokens)
    args = ["--auth-token-file", str(token_file), "--status-check-interval-seconds", "0.3"]
    router = start_router(tmp, *args, env=node_env)
    node = Node(tmp, router, node_id, node_env, *node_args)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        yield router


def ready_nodes(router: RouterProcess, count: int) -> None:
    asyncio.run(
        wait_for_health(
            router.port,
            lambda b: b["status"] == "ok" and b["load"]["request_capacity"] >= count,
            timeout=90,
        )
    )


@dataclass
class InProcessRouter:
    """A router served in the test's own event loop (``in_process_router``)."""

    port: int  # its HTTP port
    grpc_port: int  # where nodes connect
    state: Any  # its ``RouterState``
    lines: io.StringIO  # its log


@asynccontextmanager
async def in_process_router(*args: str) -> AsyncIterator[InProcessRouter]:
    """A router with ``--port 0`` and ``args`` in this event loop, its log kept in ``lines``;
    stopped at the end, its nodes' calls ended (close the test's nodes inside the block)."""
    from kcoral_server.router.http_app import make_app
    from kcoral_server.router.log import RouterLog
    from kcoral_server.router.main import GRPC_OPTIONS, build_state, end_calls
    from kcoral_server.router.nodes.gateway import Gateway, add_gateway_to_server
    from kcoral_server.router.settings import parse_router_args

    settings = parse_router_args(["--port", "0", *args])
    lines = io.StringIO()
    state = build_state(settings, RouterLog(lines))
    grpc_server = grpc.aio.server(options=GRPC_OPTIONS)
    gateway = Gateway(state.registry, settings, state.log, on_status=state.metrics.node_status)
    add_gateway_to_server(gateway, grpc_server)
    grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    server = tornado.httpserver.HTTPServer(make_app(state), max_body_size=1 << 62)
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    try:
        yield InProcessRouter(sockets[0].getsockname()[1], grpc_port, state, lines)
    finally:
        server.stop()
        end_calls(state.registry)
        await grpc_server.stop(0)
