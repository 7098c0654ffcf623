"""One port for both protocols: HTTP/1.1 connections go straight to Tornado, connections that
open with the HTTP/2 preface (``PRI * HTTP/2.0``) are relayed to gRPC's loopback port.

The split is decided with ``MSG_PEEK`` so HTTP/1.1 clients pay nothing; only gRPC bytes
cross the relay (see docs/scaling.md for its measured cost and ``--grpc-port`` to avoid it).
The relay moves bytes with ``splice(2)`` through a kernel pipe, so request bodies crossing it
are never copied into Python; where ``os.splice`` is missing it falls back to Tornado streams.

Anyone who reaches the port can open connections, so classifying one costs nothing while it
waits and has a deadline (issue 28: a client that sent ``P`` and closed kept the old peek
loop spinning a core, and 1,100 of them exhausted the descriptors): the first byte decides
unless it is ``P``; ``P``, ``PR`` and ``PRI`` are rechecked on a backing-off timer (the
socket stays readable while they sit unread, so waiting for readability would spin) and a
peer that hung up is seen with ``POLLRDHUP``. Connections still unclassified are bounded; at
the bound the oldest is dropped, so an attacker cannot lock out new clients.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import os
import select
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


class Protocol(enum.Enum):
    HTTP1 = "http/1.1"
    GRPC = "grpc"


#: Rechecks of an ambiguous prefix (``P``..``PRI``) back off from the first to the last delay.
FIRST_RECHECK_SECONDS = 0.005
LAST_RECHECK_SECONDS = 0.25
#: Connections waiting to be classified: a quarter of the descriptors, at most this many.
MAX_UNCLASSIFIED_CONNECTIONS = 1024
MIN_UNCLASSIFIED_CONNECTIONS = 16
_PEER_HUNG_UP = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR


def unclassified_bound(open_file_limit: int) -> int:
    """How many connections may wait to be classified at once under ``open_file_limit``
    descriptors: a quarter of them, so the rest stay free for clients already being served."""
    return max(
        MIN_UNCLASSIFIED_CONNECTIONS, min(MAX_UNCLASSIFIED_CONNECTIONS, open_file_limit // 4)
    )


async def classify(sock: socket.socket) -> Protocol | None:
    """Which protocol the connection speaks, or ``None`` once the peer closed without saying.

    Nothing is consumed. Only the HTTP/2 preface and HTTP/1.1 methods ``POST``, ``PUT`` and
    ``PATCH`` start with ``P``, so any other first byte is HTTP/1.1 at once, and those are
    told apart from ``PRI `` by the bytes that follow.
    """
    loop = asyncio.get_running_loop()
    while True:
        try:
            first = sock.recv(1, socket.MSG_PEEK)
            break
        except BlockingIOError:
            # Nothing pending: the descriptor is not readable, so this wait does not spin.
            await _ready(loop.add_reader, loop.remove_reader, sock.fileno())
    if not first:
        return None
    if first != HTTP2_PREFIX[:1]:
        return Protocol.HTTP1
    delay = FIRST_RECHECK_SECONDS
    while True:
        seen = sock.recv(len(HTTP2_PREFIX), socket.MSG_PEEK)  # >= 1 byte pending: no block
        if seen == HTTP2_PREFIX:
            return Protocol.GRPC
        if not HTTP2_PREFIX.startswith(seen):
            return Protocol.HTTP1
        if peer_hung_up(sock):
            return None  # a partial prefix and then EOF is neither protocol
        # The unread bytes keep the socket readable, so readiness cannot say "more came":
        # look again later, less often the longer the peer dawdles (the deadline ends it).
        await asyncio.sleep(delay)
        delay = min(delay * 2, LAST_RECHECK_SECONDS)


def peer_hung_up(sock: socket.socket) -> bool:
    """Whether the peer shut down its side (readable data still pending does not hide it)."""
    poller = select.poll()
    poller.register(sock.fileno(), _PEER_HUNG_UP)
    return any(events & _PEER_HUNG_UP for _, events in poller.poll(0))


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


class Unclassified:
    """One connection being classified: its stream and the task that classifies it.

    Whoever ends the wait closes the socket at once, so its descriptor is free before
    Tornado's next burst of accepts (up to 128 in one event-loop turn): 64 dropped sockets
    still waiting for their handler to wake would otherwise add up to ``EMFILE``.
    """

    def __init__(self, stream: tornado.iostream.IOStream) -> None:
        self.stream = stream
        self.task: asyncio.Task[Protocol | None] | None = None
        self.started = False

    async def classify_or_close(self) -> Protocol | None:
        self.started = True
        try:
            return await classify(self.stream.socket)
        except BaseException:
            # Dropped (the bound), late (the deadline) or failed: ``classify`` has taken
            # its reader off the descriptor by now, so closing it here is safe.
            self.stream.close()
            raise

    def drop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        if not self.started:
            # Its task never ran, so nothing registered the descriptor: close it now
            # (a cancelled task that never started runs none of its own code).
            self.stream.close()


class DemuxServer(tornado.tcpserver.TCPServer):
    def __init__(
        self,
        http_server: tornado.httpserver.HTTPServer,
        grpc_port: int,
        *,
        classify_timeout_seconds: float = 10.0,
        max_unclassified: int = MAX_UNCLASSIFIED_CONNECTIONS,
    ) -> None:
        """``main`` passes ``--request-head-timeout-seconds`` and ``unclassified_bound`` of
        the raised descriptor limit; the defaults are theirs at the default settings."""
        # Streams handed to Tornado's HTTP server read in whole 256 KiB pieces, so each
        # request-body ``data`` frame is full (TCPServer's default is 64 KiB: 4x the frames).
        super().__init__(read_chunk_size=MAX_FRAME_DATA)
        self.http_server = http_server
        self.grpc_port = grpc_port
        self.use_splice = hasattr(os, "splice")
        self.classify_timeout_seconds = classify_timeout_seconds
        self.max_unclassified = max_unclassified
        # Connections not yet classified, oldest first (dicts keep insertion order).
        self.unclassified: dict[tornado.iostream.IOStream, Unclassified] = {}

    async def handle_stream(self, stream: tornado.iostream.IOStream, address: Any) -> None:
        protocol = await self._classify(stream)
        if protocol is None:
            stream.close()
            return
        if protocol is Protocol.HTTP1:
            self.http_server.handle_stream(stream, address)
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

    async def _classify(self, stream: tornado.iostream.IOStream) -> Protocol | None:
        """``classify`` under the deadline and the bound; ``None``: drop the connection."""
        while len(self.unclassified) >= self.max_unclassified:
            # Drop the oldest, never the newcomer: an attacker's idle sockets age out first,
            # and a real client (which sends at once) is classified before it gets old.
            self.unclassified.pop(next(iter(self.unclassified))).drop()
        waiting = Unclassified(stream)
        waiting.task = asyncio.ensure_future(waiting.classify_or_close())
        # The deadline cancels the task itself (not ``wait_for``, whose extra task would
        # free the descriptor an event-loop turn later).
        deadline = asyncio.get_running_loop().call_later(
            self.classify_timeout_seconds, waiting.task.cancel
        )
        self.unclassified[stream] = waiting
        try:
            return await waiting.task
        except (asyncio.CancelledError, OSError):
            waiting.task.cancel()  # this handler itself was cancelled (shutdown): stop too
            return None
        finally:
            deadline.cancel()
            self.unclassified.pop(stream, None)

    async def _splice(self, stream: tornado.iostream.IOStream) -> None:
        # Take the socket away from Tornado: it never registered the descriptor (only classify
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
