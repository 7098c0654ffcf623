"""The router's client side: ``GET /health`` and streaming ``POST /execute`` (ROUTER.md §8–§9)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import tornado.iostream
import tornado.web
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.identity import MAX_FRAME_DATA, is_valid_node_id
from kcoral_server.router.log import RouterLog
from kcoral_server.router.registry import Registry
from kcoral_server.router.scheduler import Admission, NoNode, RouterBusy
from kcoral_server.router.settings import RouterSettings
from kcoral_server.router.slot import SlotBroken

from kcoral.protocol.strict_json import dumps_compact

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
NOT_FORWARDED = HOP_BY_HOP | {"host", "expect", "x-kcoral-node", "x-request-id", "content-length"}
NOT_RELAYED = HOP_BY_HOP | {"content-length", "x-kcoral-node", "x-request-id"}
TRANSPORT_MESSAGE = (
    "the tunnel to the node failed; the execution outcome is unknown and was not retried"
)


@dataclass
class RouterState:
    """Everything the handlers share (one per router process)."""

    settings: RouterSettings
    registry: Registry
    admission: Admission
    log: RouterLog
    instance_id: str
    started_at: str
    in_progress: int = 0


def utc_now_micros() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def connection_named(headers: Any) -> set[str]:
    names: set[str] = set()
    for value in headers.get_list("Connection"):
        names.update(part.strip().lower() for part in value.split(",") if part.strip())
    return names


class HealthHandler(tornado.web.RequestHandler):
    def initialize(self, state: RouterState) -> None:
        self.state = state

    def get(self) -> None:
        state = self.state
        ok = state.registry.any_ready_with_slots()
        baseline = state.registry.baseline or ({}, {})
        body = {
            "status": "ok" if ok else "unavailable",
            "instance_id": state.instance_id,
            "started_at": state.started_at,
            "gpu_count": None,
            "load": {
                "request_capacity": state.registry.capacity(),
                "requests_in_progress": state.in_progress,
                "requests_waiting": state.admission.waiting,
            },
            "target": baseline[0],
            "versions": baseline[1],
        }
        self.set_status(200 if ok else 503)
        self.set_header("Content-Type", "application/json")
        self.finish(dumps_compact(body))


class NotFoundHandler(tornado.web.RequestHandler):
    def prepare(self) -> None:
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        self.finish(b'{"error":"not found"}')


@tornado.web.stream_request_body
class ExecuteHandler(tornado.web.RequestHandler):
    def initialize(self, state: RouterState) -> None:
        self.state = state
        self.request_id = str(uuid.uuid4())
        self.received_at = time.monotonic()
        self.queue_wait_ms = 0.0
        self.node: str | None = None
        self.slot: Any = None
        self.declared: int | None = None
        self.request_bytes = 0
        self.response_bytes = 0
        self.body_done = False
        self.forwarding = False
        self.response_started = False
        self.relay_task: asyncio.Task[None] | None = None
        self.acquire_task: asyncio.Task[Any] | None = None
        self.finish_reason: str | None = None
        self.counted = False

    # -- responses made by the router itself -----------------------------------------------

    def send_router_error(self, status: int, kind: str, message: str, reason: str) -> None:
        if self._finished:
            return
        self.clear()
        self.set_status(status)
        self.set_header("X-Request-ID", self.request_id)
        self.set_header("Content-Type", "application/json")
        if status == 503:
            self.set_header("Retry-After", "1")
        body = {
            "status": "ERROR",
            "request_id": self.request_id,
            "error": {"kind": kind, "message": message},
        }
        self.finish_reason = self.finish_reason or reason
        self.finish(dumps_compact(body))

    # -- request side ----------------------------------------------------------------------

    async def prepare(self) -> None:
        self.set_header("X-Request-ID", self.request_id)
        if self.request.method != "POST":
            self.set_status(405)
            self.set_header("Allow", "POST")
            self.finish_reason = "request_rejected"
            self.finish()
            return
        lengths = self.request.headers.get_list("Content-Length")
        if lengths:
            values = {v.strip() for v in ",".join(lengths).split(",")}
            if len(values) != 1 or not next(iter(values)).isdigit():
                self.send_router_error(
                    400, "invalid_request", "invalid Content-Length", "request_rejected"
                )
                return
            self.declared = int(next(iter(values)))
            if self.declared > self.state.settings.max_request_bytes:
                self.send_router_error(
                    413, "request_too_large", "request body is too large", "request_rejected"
                )
                return
        affinity = None
        preferred = self.request.headers.get_list("X-KCoral-Node")
        if len(preferred) == 1 and is_valid_node_id(preferred[0]):
            affinity = preferred[0]
        loop = asyncio.get_running_loop()
        self.acquire_task = loop.create_task(
            self.state.admission.acquire(affinity, self.request_id)
        )
        try:
            node, slot = await self.acquire_task
        except RouterBusy:
            self.send_router_error(503, "router_busy", "router queue is full", "queue_full")
            return
        except NoNode:
            self.send_router_error(
                503, "no_node", "no compatible node has an available slot", "queue_timeout"
            )
            return
        except asyncio.CancelledError:
            return  # the client went away while queued
        finally:
            self.queue_wait_ms = (time.monotonic() - self.received_at) * 1000
        self.node, self.slot = node.node_id, slot
        self.state.in_progress += 1
        self.counted = True
        self.forwarding = True
        head = pb.RequestHead(headers=self._forwarded_headers())
        if self.declared is not None:
            head.content_length = self.declared
        self.relay_task = loop.create_task(self._relay_response())
        await self._send(pb.SlotFrame(request_id=self.request_id, request_head=head))

    def _forwarded_headers(self) -> list[pb.HttpHeader]:
        dropped = NOT_FORWARDED | connection_named(self.request.headers)
        headers = [
            pb.HttpHeader(name=name.encode("latin-1"), value=value.encode("latin-1"))
            for name, value in self.request.headers.get_all()
            if name.lower() not in dropped
        ]
        headers.append(pb.HttpHeader(name=b"x-request-id", value=self.request_id.encode()))
        if self.declared is not None:
            headers.append(pb.HttpHeader(name=b"content-length", value=str(self.declared).encode()))
        return headers

    async def _send(self, frame: pb.SlotFrame) -> None:
        try:
            await self.slot.send(frame)
        except SlotBroken:
            self.forwarding = False  # the relay task reports the failure

    async def data_received(self, chunk: bytes) -> None:
        if not self.forwarding:
            return
        self.request_bytes += len(chunk)
        limit = self.state.settings.max_request_bytes
        if self.request_bytes > limit:
            self._reject_body(413, "request_too_large", "request body is too large")
            return
        if self.declared is not None and self.request_bytes > self.declared:
            self._reject_body(400, "invalid_request", "Content-Length does not match request body")
            return
        view = memoryview(chunk)
        for start in range(0, len(view), MAX_FRAME_DATA):
            piece = bytes(view[start : start + MAX_FRAME_DATA])
            await self._send(pb.SlotFrame(request_id=self.request_id, data=piece))
            if not self.forwarding:
                return

    async def post(self) -> None:
        if self.forwarding:
            if self.declared is not None and self.request_bytes != self.declared:
                self._reject_body(
                    400, "invalid_request", "Content-Length does not match request body"
                )
            else:
                # Set first: the node may answer completely before this write returns.
                self.body_done = True
                await self._send(pb.SlotFrame(request_id=self.request_id, end=pb.EndOfBody()))
        if self.relay_task is not None:
            await asyncio.shield(self.relay_task)

    def _reject_body(self, status: int, kind: str, message: str) -> None:
        self.forwarding = False
        if self.slot is not None:
            self.slot.cancel("request_rejected")
        if not self.response_started:
            if self.relay_task is not None:
                self.relay_task.cancel()
            self.send_router_error(status, kind, message, "request_rejected")
        else:
            self.finish_reason = "request_rejected"
            self._abort_connection()

    # -- response side ---------------------------------------------------------------------

    async def _relay_response(self) -> None:
        slot = self.slot
        try:
            head = await slot.next_frame()
            status, headers = self._check_head(head)
            if status is None:
                self._invalid_response()
                return
            if status == 503:
                self.state.registry.mark_saturated(self.node)
            self.clear()
            self.clear_header("Content-Type")
            self.clear_header("Date")
            self.clear_header("Server")
            self.set_status(status)
            for name, value in headers:
                self.add_header(name, value)
            self.set_header("X-KCoral-Node", self.node)
            self.set_header("X-Request-ID", self.request_id)
            self.response_started = True
            await self.flush()
            while True:
                frame = await slot.next_frame()
                kind = frame.WhichOneof("payload")
                if kind == "end":
                    break
                if kind != "data" or len(frame.data) > MAX_FRAME_DATA:
                    self._invalid_response()
                    return
                self.response_bytes += len(frame.data)
                self.write(frame.data)
                await self.flush()
        except SlotBroken as exc:
            if self._finished:
                return
            self.finish_reason = self.finish_reason or (
                "invalid_response" if exc.reason == "invalid_response" else "tunnel_disconnected"
            )
            if self.response_started:
                self._abort_connection()
            else:
                self.send_router_error(
                    502, "server_transport", TRANSPORT_MESSAGE, self.finish_reason
                )
            return
        except tornado.iostream.StreamClosedError:
            self.on_connection_close()
            return
        if self.body_done:
            self.state.registry.release(slot)
        else:
            # The node answered before the whole body arrived (early rejection).
            self.forwarding = False
            slot.cancel("request_rejected")
        self.finish_reason = self.finish_reason or "completed"
        self.slot_done()
        if not self._finished:
            self.finish()

    def _check_head(self, frame: pb.SlotFrame) -> tuple[int | None, list[tuple[str, str]]]:
        if frame.WhichOneof("payload") != "response_head":
            return None, []
        status = frame.response_head.status
        if not 200 <= status <= 599:
            return None, []
        headers = []
        try:
            for header in frame.response_head.headers:
                name = header.name.decode("ascii")
                value = header.value.decode("latin-1")
                if (
                    not name
                    or any(c in name for c in " :\r\n\0")
                    or any(c in value for c in "\r\n\0")
                ):
                    return None, []
                if name.lower() not in NOT_RELAYED:
                    headers.append((name, value))
        except UnicodeDecodeError:
            return None, []
        return status, headers

    def _invalid_response(self) -> None:
        self.finish_reason = "invalid_response"
        self.slot.cancel("invalid_response")
        self.forwarding = False
        self.slot_done()
        if self.response_started:
            self._abort_connection()
        else:
            self.send_router_error(502, "server_transport", TRANSPORT_MESSAGE, "invalid_response")

    def _abort_connection(self) -> None:
        self.slot_done()
        stream = self.request.connection.stream if self.request.connection else None
        if stream is not None:
            stream.close()

    def slot_done(self) -> None:
        if self.counted:
            self.counted = False
            self.state.in_progress -= 1

    def on_connection_close(self) -> None:
        if self.acquire_task is not None and not self.acquire_task.done():
            self.acquire_task.cancel()
        if self.slot is not None and self.slot.request_id == self.request_id:
            self.slot.cancel("client_disconnected")
        self.forwarding = False
        self.finish_reason = self.finish_reason or "client_disconnected"
        self.slot_done()
        if self.relay_task is not None and not self.relay_task.done():
            self.relay_task.cancel()
        self._log_finished()

    def on_finish(self) -> None:
        self.slot_done()
        self._log_finished()

    def _log_finished(self) -> None:
        if getattr(self, "_logged", False):
            return
        self._logged = True
        reason = self.finish_reason or "completed"
        level = "INFO" if reason == "completed" else "WARNING"
        self.state.log.event(
            "request_finished",
            level=level,
            request_id=self.request_id,
            node=self.node,
            http_status=self.get_status(),
            queue_wait_ms=round(self.queue_wait_ms, 1),
            duration_ms=round((time.monotonic() - self.received_at) * 1000, 1),
            request_bytes=self.request_bytes,
            response_bytes=self.response_bytes,
            finish_reason=reason,
        )


def make_app(state: RouterState) -> tornado.web.Application:
    return tornado.web.Application(
        [
            (r"/health", HealthHandler, {"state": state}),
            (r"/execute", ExecuteHandler, {"state": state}),
        ],
        default_handler_class=NotFoundHandler,
        # request_finished is the router's access log; Tornado's would duplicate it.
        log_function=lambda handler: None,
    )
