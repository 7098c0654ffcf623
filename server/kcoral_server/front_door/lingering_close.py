"""Lingering close: a connection answered before its request body was read to the end is
closed once the client has stopped sending, not at once.

Tornado closes such a connection as soon as the answer is written (the only way not to
read the rest of the body). A socket closed with unread bytes makes the kernel reset the
connection, and the reset can destroy the answer before the client reads it: a client that
sends its whole body before reading (urllib3, ``http.client``, the node tunnel's loopback
client, whose failed write ends its reading too) then sees ``Connection reset by peer``,
a broken pipe or an empty body instead of the 413 or 401 it was sent. Through a router,
about 1 too-large upload in 10 reached its client as a 502 (the tunnel lost the node's 413)
or as a reset (the router lost its own relay of it).

Here the close sends a FIN after the answer (``shutdown(SHUT_WR)``), then reads and drops
what the client still sends until it closes too, and only then closes the socket.

Who can reach what: only a caller past the browser guard and the token check gets a
lingering close (``KCoralRequestHandler.linger_allowed``): a web page's or a token-less
client's refused body is still never read (their 403 and 401 close at once), and a token
holder could send as much to ``/execute`` anyway. A lingering socket costs one descriptor
and what the kernel buffers for it; nothing read is kept (one shared scratch buffer). At
most ``MAX_LINGERING`` sockets linger at once (any more close at once, as before), each for
at most ``LINGER_SECONDS``, and ``IDLE_SECONDS`` without a byte ends it sooner.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from tornado.iostream import IOStream, SSLIOStream

#: the longest a socket lingers after its answer (nginx's ``lingering_time``)
LINGER_SECONDS = 30.0
#: a client that sends nothing for this long is not waited for (nginx's ``lingering_timeout``)
IDLE_SECONDS = 5.0
#: the most sockets lingering at once; more close at once
MAX_LINGERING = 256

_scratch = bytearray(64 * 1024)  # what lingering sockets read into, never looked at
_lingering: set[_Linger] = set()


def linger_on_close(stream: Any) -> None:
    """Make ``stream``'s close (Tornado's, once the answer is out) a lingering one."""
    if not isinstance(stream, IOStream) or isinstance(stream, SSLIOStream):
        return  # TLS ends with its own close_notify: not ours to half-close
    if getattr(stream, "_kcoral_lingers", False):
        return
    close_now = stream.close_fd

    def close_fd() -> None:
        sock = stream.socket
        if sock is None or len(_lingering) >= MAX_LINGERING:
            close_now()
            return
        stream.socket = None  # type: ignore[assignment]  # as IOStream.close_fd leaves it
        _Linger(sock).start()

    stream.close_fd = close_fd  # type: ignore[method-assign]
    stream._kcoral_lingers = True  # type: ignore[attr-defined]


def lingering_count() -> int:
    """How many sockets linger now (tests and the bound)."""
    return len(_lingering)


class _Linger:
    """One socket after its answer: half-closed, read and dropped until the peer closes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.deadline: asyncio.TimerHandle | None = None
        self.idle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)  # the answer is out: say so with a FIN
            self.loop.add_reader(self.sock.fileno(), self._readable)
        except (OSError, ValueError):  # the peer is gone already
            self.sock.close()
            return
        _lingering.add(self)
        self.deadline = self.loop.call_later(LINGER_SECONDS, self.end)
        self.idle = self.loop.call_later(IDLE_SECONDS, self.end)

    def _readable(self) -> None:
        try:
            got = self.sock.recv_into(_scratch)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.end()
            return
        if got == 0:  # the client closed: nothing more will come
            self.end()
            return
        if self.idle is not None:
            self.idle.cancel()
        self.idle = self.loop.call_later(IDLE_SECONDS, self.end)

    def end(self) -> None:
        if self not in _lingering:
            return
        _lingering.discard(self)
        for timer in (self.deadline, self.idle):
            if timer is not None:
                timer.cancel()
        try:
            self.loop.remove_reader(self.sock.fileno())
        except (OSError, ValueError):
            pass
        self.sock.close()
