"""One port for both protocols: HTTP/1.1 connections go straight to Tornado, connections that
open with the HTTP/2 preface (``PRI * HTTP/2.0``) are relayed to gRPC's loopback port.

The split is decided with ``MSG_PEEK`` so HTTP/1.1 clients pay nothing; only gRPC bytes
cross the relay (see docs/scaling.md for its measured cost and ``--grpc-port`` to avoid it).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import tornado.httpserver
import tornado.iostream
import tornado.tcpclient
import tornado.tcpserver

HTTP2_PREFIX = b"PRI "
RELAY_CHUNK = 1 << 18


async def peek(sock: socket.socket, count: int) -> bytes:
    """Wait until ``count`` bytes (or EOF) can be peeked without consuming them."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = sock.recv(count, socket.MSG_PEEK)
        except BlockingIOError:
            data = None
        if data is not None and (len(data) >= count or data == b""):
            return data
        ready = loop.create_future()
        loop.add_reader(sock.fileno(), _resolve, ready)
        try:
            await ready
        finally:
            loop.remove_reader(sock.fileno())


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def pipe(source: tornado.iostream.IOStream, sink: tornado.iostream.IOStream) -> None:
    try:
        while True:
            data = await source.read_bytes(RELAY_CHUNK, partial=True)
            await sink.write(data)
    except tornado.iostream.StreamClosedError:
        pass
    finally:
        source.close()
        sink.close()


class DemuxServer(tornado.tcpserver.TCPServer):
    def __init__(self, http_server: tornado.httpserver.HTTPServer, grpc_port: int) -> None:
        super().__init__()
        self.http_server = http_server
        self.grpc_port = grpc_port

    async def handle_stream(self, stream: tornado.iostream.IOStream, address: Any) -> None:
        try:
            prefix = await peek(stream.socket, len(HTTP2_PREFIX))
        except OSError:
            stream.close()
            return
        if prefix != HTTP2_PREFIX:
            if prefix:
                self.http_server.handle_stream(stream, address)
            else:
                stream.close()
            return
        try:
            upstream = await tornado.tcpclient.TCPClient().connect("127.0.0.1", self.grpc_port)
        except OSError:
            stream.close()
            return
        for s in (stream, upstream):
            s.set_nodelay(True)
        await asyncio.gather(pipe(stream, upstream), pipe(upstream, stream))
