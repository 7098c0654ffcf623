"""The bulk path of a routed request: wire-level data frames, the splice relay of the shared
port, full 256 KiB frames from the router, and the node tunnel streaming large bodies."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from typing import Any

import grpc
import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from kcoral_server.node.tunnel import Tunnel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.listener import DemuxServer
from kcoral_server.router.nodes import frames
from router_helpers import FakeNode, RouterProcess, http_request, wait_for_health

FRAME = 262144
REQUEST_ID = "0b5e7c1e-9f1c-4b53-a5a0-2f3b9c8d1e2f"


# -- wire-level data frames --------------------------------------------------------------


@pytest.mark.parametrize("request_id", ["", "x", REQUEST_ID])
@pytest.mark.parametrize("size", [0, 1, 127, 128, 1025, 16384, FRAME])
def test_an_encoded_data_frame_is_byte_for_byte_what_protobuf_writes(
    request_id: str, size: int
) -> None:
    data = os.urandom(size)
    expected = pb.SlotFrame(request_id=request_id, data=data).SerializeToString()
    assert frames.encode_data(request_id, data) == expected
    assert frames.encode_data(request_id, memoryview(data)) == expected


@pytest.mark.parametrize("parse", [frames.parse_frame, frames.parse_frame_view])
def test_a_parsed_data_frame_reads_like_the_protobuf_message(parse: Any) -> None:
    data = os.urandom(FRAME)
    frame = parse(frames.encode_data(REQUEST_ID, data))
    assert frame.WhichOneof("payload") == "data"
    assert frame.HasField("data") and not frame.HasField("end")
    assert frame.request_id == REQUEST_ID
    assert bytes(frame.data) == data and len(frame.data) == FRAME
    assert isinstance(frames.parse_frame(frames.encode_data(REQUEST_ID, data)).data, bytes)


def test_other_frames_and_odd_encodings_go_through_protobuf() -> None:
    data = os.urandom(4096)
    head = pb.SlotFrame(request_id=REQUEST_ID, request_head=pb.RequestHead(content_length=5))
    end = pb.SlotFrame(request_id=REQUEST_ID, end=pb.EndOfBody())
    for message in (head, end):
        parsed = frames.parse_frame(message.SerializeToString())
        assert isinstance(parsed, pb.SlotFrame) and parsed == message
    # Repeated fields and unknown fields are legal protobuf: the fast path leaves them alone.
    twice = frames.encode_data("a", b"") + frames.encode_data(REQUEST_ID, data)
    assert frames.parse_frame(twice) == pb.SlotFrame.FromString(twice)
    unknown = frames.encode_data(REQUEST_ID, data) + b"\x48\x01"
    assert isinstance(frames.parse_frame(unknown), pb.SlotFrame)
    # A request id that is not UTF-8 is refused exactly as protobuf refuses it.
    bad_id = b"\x0a\x02\xff\xfe\x22" + frames.varint(len(data)) + data
    with pytest.raises(DecodeError):
        frames.parse_frame(bad_id)
    truncated = frames.encode_data(REQUEST_ID, data)[:-1]
    with pytest.raises(DecodeError):
        frames.parse_frame(truncated)


def test_the_serializer_passes_encoded_frames_and_serializes_messages() -> None:
    raw = frames.encode_data(REQUEST_ID, b"abc")
    assert frames.serialize_frame(raw) is raw
    ack = pb.SlotFrame(ack=pb.SlotAck())
    assert frames.serialize_frame(ack) == ack.SerializeToString()


def _read(frame: Any) -> tuple[str, str | None, bytes | None]:
    kind = frame.WhichOneof("payload")
    return frame.request_id, kind, bytes(frame.data) if kind == "data" else None


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.binary(min_size=1025, max_size=1200),
        st.builds(
            lambda rid, data, tail: frames.encode_data(rid, data) + tail,
            st.text(max_size=40),
            st.binary(min_size=1025, max_size=1100),
            st.binary(max_size=6),
        ),
    )
)
def test_the_fast_path_agrees_with_protobuf_on_any_input(raw: bytes) -> None:
    try:
        expected = _read(pb.SlotFrame.FromString(raw))
    except DecodeError:
        expected = None
    for parse in (frames.parse_frame, frames.parse_frame_view):
        try:
            got = _read(parse(raw))
        except DecodeError:
            got = None
        assert got == expected


# -- the shared port's relay --------------------------------------------------------------


async def _echo_server() -> tuple[asyncio.AbstractServer, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("use_splice", [True, False])
def test_the_relay_carries_http2_connections_byte_for_byte_both_ways(use_splice: bool) -> None:
    async def scenario() -> None:
        echo, echo_port = await _echo_server()
        demux = DemuxServer(tornado.httpserver.HTTPServer(lambda request: None), echo_port)
        demux.use_splice = use_splice and demux.use_splice
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        demux.add_sockets([listener])
        payload = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(3 << 20)
        reader, writer = await asyncio.open_connection(*listener.getsockname())

        async def send() -> None:
            for start in range(0, len(payload), 100_000):
                writer.write(payload[start : start + 100_000])
                await writer.drain()

        sender = asyncio.ensure_future(send())
        received = await asyncio.wait_for(reader.readexactly(len(payload)), 30)
        await sender
        writer.close()
        demux.stop()
        echo.close()
        assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()

    asyncio.run(scenario())


# -- through a real router ------------------------------------------------------------------


class RecordingNode(FakeNode):
    """A fake node that records the size of every request ``data`` frame and answers with
    the body's SHA-256 followed by ``reply_bytes`` of its own."""

    sizes: list[int]
    reply: bytes = b""

    async def _serve(self, call: Any, slot_kind: str = "worker") -> None:
        try:
            while True:
                frame = await call.read()
                if frame is grpc.aio.EOF or frame.WhichOneof("payload") != "request_head":
                    return
                rid, digest = frame.request_id, hashlib.sha256()
                while (frame := await call.read()).WhichOneof("payload") == "data":
                    self.sizes.append(len(frame.data))
                    digest.update(frame.data)
                body = digest.hexdigest().encode() + self.reply
                head = pb.ResponseHead(status=200, headers=[])
                await call.write(pb.SlotFrame(request_id=rid, response_head=head))
                for start in range(0, len(body), FRAME):
                    await call.write(pb.SlotFrame(request_id=rid, data=body[start : start + FRAME]))
                await call.write(pb.SlotFrame(request_id=rid, end=pb.EndOfBody()))
        except (grpc.RpcError, asyncio.CancelledError):
            return


def test_a_large_body_crosses_the_router_intact_in_frames_of_at_most_256_kib(
    router: RouterProcess,
) -> None:
    async def scenario() -> None:
        node = RecordingNode(router.port, "bulk")
        node.sizes, node.reply = [], os.urandom(FRAME * 3 + 5)
        await node.start()
        await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 1)
        body = os.urandom(5 * FRAME + 1234)
        response = await http_request(router.port, "POST", "/execute", body)
        await node.close()
        assert response.status == 200
        assert response.body == hashlib.sha256(body).hexdigest().encode() + node.reply
        assert sum(node.sizes) == len(body) and max(node.sizes) <= FRAME

    asyncio.run(scenario())


def test_the_shared_port_reads_request_bodies_in_whole_frames() -> None:
    # TCPServer's default is 64 KiB: four times the data frames for the same body.
    demux = DemuxServer(tornado.httpserver.HTTPServer(lambda request: None), 1)
    assert demux.read_chunk_size == FRAME


class Echo(tornado.web.RequestHandler):
    """Stand-in for the node's own ``POST /execute``: answers the body's length and hash."""

    def post(self) -> None:
        body = self.request.body
        self.write(json.dumps({"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}))


class SupervisorOnly(FakeNode):
    """Reports a healthy node but opens no slots: a real ``Tunnel`` opens them."""

    async def open_slot(self, kind: str = "worker") -> Any:
        return None


def test_the_node_tunnel_streams_large_bodies_with_and_without_a_length(
    router: RouterProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCORAL_NODE_CONTROL_SLOTS", "0")

    async def scenario() -> None:
        server = tornado.httpserver.HTTPServer(
            tornado.web.Application([("/execute", Echo)]), max_body_size=1 << 30
        )
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        server.add_sockets(sockets)
        local = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        node = SupervisorOnly(router.port, "tunnel")
        await node.start()
        tunnel = Tunnel(router.url, "tunnel", None, node.instance_id, local, 1, None)
        tunnel.start()
        try:
            await wait_for_health(router.port, lambda b: b["load"]["request_capacity"] >= 1)
            body = os.urandom(3 * FRAME + 777)
            expected = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
            sized = await http_request(router.port, "POST", "/execute", body)
            assert sized.status == 200 and sized.json() == expected
            pieces = [body[i : i + 100_000] for i in range(0, len(body), 100_000)]
            chunked = await http_request(router.port, "POST", "/execute", chunks=pieces)
            assert chunked.status == 200 and chunked.json() == expected
        finally:
            await tunnel.close()
            await node.close()
            server.stop()

    asyncio.run(scenario())
