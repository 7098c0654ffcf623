"""An HTTP client for one relayed event stream, whose ``close`` ends the stream.

The server extension relays a job's Server-Sent Events from a KCoral server to the browser
(``job_events.JobEventsHandler``). When the browser goes away (the panel selects
another job, the tab closes), the upstream request must end with it, or each abandoned
stream holds a connection to the KCoral server for as long as the job runs. Tornado's
``SimpleAsyncHTTPClient.close`` does not end requests in flight, and a request cannot be
cancelled; so each relay has a client of its own (never the server's client that the other
routes use, ``KCoralExtension.client_for``, whose 10 connections abandoned streams would
fill), whose ``close`` also closes every connection it opened.
"""

from __future__ import annotations

from typing import Any

from tornado.iostream import IOStream
from tornado.netutil import Resolver
from tornado.simple_httpclient import SimpleAsyncHTTPClient
from tornado.tcpclient import TCPClient


class _ClosingTCPClient(TCPClient):
    """Opens connections as ``TCPClient`` does and closes them all on ``close``."""

    def __init__(self, resolver: Resolver | None = None) -> None:
        super().__init__(resolver)
        self._streams: list[IOStream] = []
        self._closed = False

    async def connect(self, *args: Any, **kwargs: Any) -> IOStream:
        stream = await super().connect(*args, **kwargs)
        self._streams.append(stream)
        if self._closed:  # closed while it connected
            stream.close()
        return stream

    def close(self) -> None:
        self._closed = True
        for stream in self._streams:
            stream.close()
        self._streams.clear()
        super().close()


class RelayClient(SimpleAsyncHTTPClient):
    """``RelayClient(force_instance=True)``: a client of its own, for one relay; its
    ``close`` ends the request in flight (its fetch fails with ``HTTPStreamClosedError``)."""

    def initialize(self, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.tcp_client = _ClosingTCPClient(resolver=self.resolver)
