"""Keep-alive pools that drop a connection before the server would close it.

A KCoral server or router closes a connection that has not sent its next request head within
10 s of the previous answer (``--request-head-timeout-seconds``, issue 28). A request sent
on a pooled connection just as the server closes it fails (or, for a ``POST``, leaves it
unknown whether the server ran it), and this client never retries. So a connection that sat
in the pool for ``POOLED_IDLE_SECONDS``, half the servers' default, is closed and replaced
before it is used: it never meets the server's deadline.
"""

from __future__ import annotations

import time
from typing import Any

import urllib3
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from kcoral.connection.request_connection import returned, taken

#: A pooled connection idle longer than this is not reused (servers close at 10 s).
POOLED_IDLE_SECONDS = 5.0

_POOLED_AT = "_kcoral_pooled_at"


class _DropsIdleConnections:
    """Mixed into urllib3's pools: stamp a connection when it comes back, and close a stale
    one when it is taken out (urllib3 then connects it afresh, as for a dropped one)."""

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            setattr(conn, _POOLED_AT, time.monotonic())
            returned(conn)  # its request is over: a late cut of it must not reach the next
        super()._put_conn(conn)  # type: ignore[misc]

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        pooled_at = getattr(conn, _POOLED_AT, None)
        if pooled_at is not None and time.monotonic() - pooled_at >= POOLED_IDLE_SECONDS:
            conn.close()
        # the request's record: cut from an AsyncClient's event loop, shut at its answer's
        # deadline, its body stopped once an answer waits on it
        taken(conn)
        return conn


class FreshHTTPConnectionPool(_DropsIdleConnections, HTTPConnectionPool):
    pass


class FreshHTTPSConnectionPool(_DropsIdleConnections, HTTPSConnectionPool):
    pass


def pool_manager(**options: Any) -> urllib3.PoolManager:
    """A ``urllib3.PoolManager`` (same ``options``) whose pools drop idle connections early."""
    manager = urllib3.PoolManager(**options)
    manager.pool_classes_by_scheme = {
        "http": FreshHTTPConnectionPool,
        "https": FreshHTTPSConnectionPool,
    }
    return manager
