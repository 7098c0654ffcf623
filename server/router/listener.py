"""One port for both protocols: HTTP/1.1 connections go straight to Tornado, connections that
open with the HTTP/2 preface (``PRI * HTTP/2.0``) are relayed to gRPC's loopback port.

The split is decided with ``MSG_PEEK`` so HTTP/1.1 clients pay nothing; only gRPC bytes
cross the relay (see docs/scaling.md for its measured cost and ``--grpc-port`` to avoid it).
The relay moves bytes with ``splice(2)`` through a kernel pipe, so request bodies crossing it
are never copied into Python; where ``os.splice`` is missing it falls back to Tornado streams.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
from typing import Any

import tornado.httpserver
import tornado.iostream
import tornado.tcpclient
import tornado.tcpserver
from kcoral_server.router.identity import MAX_FRAME_DATA

HTTP2_PREFIX = b"PRI "
RELAY_CHUNK = 1 << 18
#: Pipe capacity for the splice relay (Linux ``F_SETPIPE_SZ``); the default 64 KiB pipe
#: would split every 256 KiB frame into four round trips through the event loop.
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)


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
        await _ready(loop.add_reader, loop.remove_reader, sock.fileno())


async def _ready(add: Any, remove: Any, fd: int) -> None:
    """Wait once until ``fd`` is readable (``add_reader``) or writable (``add_writer``)."""
    ready = asyncio.get_running_loop().create_future()
    add(fd, _resolve, ready)
    try:
        await ready
    finally:
        remove(fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def pipe(source: tornado.iostream.IOStream, sink: tornado.iostream.IOStream) -> None:
    """Fallback relay of one direction through Tornado streams (copies through Python)."""
    try:
        while True:
            data = await source.read_bytes(RELAY_CHUNK, partial=True)
            await sink.write(data)
    except tornado.iostream.StreamClosedError:
        pass
    finally:
        source.close()
        sink.close()


def open_pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # a smaller pipe (fs.pipe-max-size) only means more, smaller splices
    return read_end, write_end


async def splice_pipe(source: socket.socket, sink: socket.socket) -> None:
    """Relay one direction ``source`` → ``sink`` inside the kernel until EOF or an error.

    Both sockets are non-blocking; the event loop only waits for readiness. On EOF the
    write side of ``sink`` is shut down (the other direction may still be running).
    """
    loop = asyncio.get_running_loop()
    read_end, write_end = open_pipe()
    src, dst = source.fileno(), sink.fileno()
    readable = asyncio.Event()
    # The reader stays registered (no epoll_ctl pair per small gRPC message); it is only
    # taken off while waiting for the sink, where a readable source would spin the loop.
    loop.add_reader(src, readable.set)
    try:
        while True:
            try:
                pending = os.splice(src, write_end, PIPE_SIZE, flags=SPLICE_FLAGS)
            except BlockingIOError:
                readable.clear()
                await readable.wait()
                continue
            if pending == 0:
                sink.shutdown(socket.SHUT_WR)
                return
            while pending:
                try:
                    pending -= os.splice(read_end, dst, pending, flags=SPLICE_FLAGS)
                except BlockingIOError:
                    loop.remove_reader(src)
                    try:
                        await _ready(loop.add_writer, loop.remove_writer, dst)
                    finally:
                        loop.add_reader(src, readable.set)
    finally:
        loop.remove_reader(src)
        os.close(read_end)
        os.close(write_end)


async def splice_relay(client: socket.socket, upstream: socket.socket) -> None:
    """Relay both directions until both reached EOF or either failed; then close both."""
    tasks = [
        asyncio.ensure_future(splice_pipe(client, upstream)),
        asyncio.ensure_future(splice_pipe(upstream, client)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        # A broken connection is routine (a node went away; it reconnects on its own).
        await asyncio.gather(*tasks, return_exceptions=True)
        client.close()
        upstream.close()


class DemuxServer(tornado.tcpserver.TCPServer):
    def __init__(self, http_server: tornado.httpserver.HTTPServer, grpc_port: int) -> None:
        # Streams handed to Tornado's HTTP server read in whole 256 KiB pieces, so each
        # request-body ``data`` frame is full (TCPServer's default is 64 KiB: 4x the frames).
        super().__init__(read_chunk_size=MAX_FRAME_DATA)
        self.http_server = http_server
        self.grpc_port = grpc_port
        self.use_splice = hasattr(os, "splice")

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
        if self.use_splice:
            await self._splice(stream)
            return
        try:
            upstream = await tornado.tcpclient.TCPClient().connect("127.0.0.1", self.grpc_port)
        except OSError:
            stream.close()
            return
        for s in (stream, upstream):
            s.set_nodelay(True)
        await asyncio.gather(pipe(stream, upstream), pipe(upstream, stream))

    async def _splice(self, stream: tornado.iostream.IOStream) -> None:
        # Take the socket away from Tornado: it never registered the descriptor (only peek
        # did, and it unregistered), and from here on only the relay touches it.
        client = stream.socket
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(upstream, ("127.0.0.1", self.grpc_port))
        except OSError:
            upstream.close()
            client.close()
            return
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await splice_relay(client, upstream)
