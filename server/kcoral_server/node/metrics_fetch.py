"""The node supervisor's reading of its child's ``/metrics`` (EXTENSIONS §13, ROUTER §4): a
node opens no inbound port, so its server's series travel up the supervisor stream, in
``SupervisorStatus.node_metrics``.

Who reaches what: the supervisor asks the child over loopback, as its health probe does, with
the router secret, which the child (holding no client token) requires on every endpoint
(ROUTER §12); nobody else learns that secret. The text is the child's own counts, with no
token, identity or program in it; the router re-checks it anyway (``metrics.node_relay``).

Not in every status: the text is tens of kilobytes and the router parses it, while statuses
go every health interval (2 s). It is read at the first healthy probe and then every
``--metrics-interval-seconds`` (15 s, a usual Prometheus scrape interval; 0: never) and sent
once, in the next status; a read that fails sends ``NO_SERIES`` instead.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kcoral_server.metrics.node_relay import MAX_NODE_METRICS_BYTES
from kcoral_server.node.http11 import HttpError, get
from kcoral_server.router.log import RouterLog

if TYPE_CHECKING:
    from kcoral_server.settings.command_line import SupervisorOptions

ProbeAt = tuple[str, tuple[str, int] | None]

#: sent instead of the text when a read fails: a text without series, so the router drops
#: the node's last one (an empty field means "nothing new", and the router kept showing the
#: last text's gauges, a queue or busy workers long gone, for as long as the reads failed)
NO_SERIES = b"# kcoral: the server's /metrics could not be read\n"


async def fetch_metrics(child_url: str, probe_at: ProbeAt, secret: str, timeout: float) -> bytes:
    """The child's ``/metrics`` text; raises ``OSError``, ``HttpError`` or
    ``asyncio.TimeoutError`` (``probe_at``: the loopback host and source address to use)."""
    host, local = probe_at
    port = urlsplit(child_url).port or 80
    status, body = await asyncio.wait_for(
        get(
            host,
            port,
            "/metrics",
            local_addr=local,
            bearer=secret,
            limit=MAX_NODE_METRICS_BYTES,
        ),
        timeout,
    )
    if status != 200:
        raise HttpError(f"/metrics answered HTTP {status}")
    return body


class MetricsReader:
    """When the child's metrics are read, and the text waiting for the next status."""

    def __init__(self, options: SupervisorOptions, probe_at: ProbeAt, log: RouterLog) -> None:
        self.interval = options.metrics_interval_seconds
        self.timeout = options.health_timeout_seconds
        self.probe_at = probe_at  # where the health probe goes (supervisor.probe_target)
        self.log = log
        self._next = 0.0
        self._pending = b""
        self._failing = False

    async def refresh(self, child_url: str, secret: str) -> None:
        """Read the text when it is due (after a healthy probe); a failure is logged once
        until a read succeeds again, and never makes the child unhealthy."""
        now = time.monotonic()
        if self.interval <= 0 or now < self._next:
            return
        self._next = now + self.interval
        try:
            self._pending = await fetch_metrics(child_url, self.probe_at, secret, self.timeout)
            self._failing = False
        except (OSError, HttpError, asyncio.TimeoutError) as exc:
            self._pending = NO_SERIES
            if not self._failing:
                self.log.event(
                    "node_metrics_unavailable",
                    "WARNING",
                    error=str(exc) or type(exc).__name__,
                )
            self._failing = True

    def take(self) -> bytes:
        """The text read since the last status, once; empty otherwise."""
        pending, self._pending = self._pending, b""
        return pending

    def restart(self) -> None:
        """A new child: read its text at its first healthy probe."""
        self._next = 0.0
        self._pending = b""
