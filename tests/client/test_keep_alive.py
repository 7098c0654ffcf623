"""The client's keep-alive pools (``kcoral.connection.keep_alive``) against a real server: a
connection
idle for ``POOLED_IDLE_SECONDS`` (half the server's 10 s head deadline) is replaced before it
is used, so a request never races the server closing it; one the server already closed is
replaced without an error (issue 28 point 1)."""

from __future__ import annotations

import time

import psutil
from server_process import RunningServer

from kcoral.connection.http import HttpTransport
from kcoral.connection.keep_alive import POOLED_IDLE_SECONDS


def client_ports(server: RunningServer) -> set[int]:
    """The client-side ports of the connections the server holds open."""
    return {
        connection.raddr.port
        for connection in psutil.Process(server.process.pid).net_connections(kind="tcp")
        if connection.status == psutil.CONN_ESTABLISHED
        and connection.laddr.port == server.port
        and connection.raddr
    }


def transport(server: RunningServer) -> HttpTransport:
    return HttpTransport(server.url, headers={}, connect_timeout_seconds=30)


def test_a_connection_idle_for_half_the_servers_deadline_is_replaced_before_use(
    server_factory,
) -> None:
    server = server_factory()  # the default 10 s head deadline
    client = transport(server)
    try:
        assert client.request("GET", "/health").status == 200
        first = client_ports(server)
        assert len(first) == 1  # kept alive for reuse
        assert client.request("GET", "/health").status == 200
        assert client_ports(server) == first  # a fresh connection is reused at once
        time.sleep(POOLED_IDLE_SECONDS + 1)  # still open at the server (10 s), stale here
        assert client.request("GET", "/health").status == 200
        second = client_ports(server)
        assert len(second) == 1 and second != first
    finally:
        client.close()


def test_a_connection_the_server_closed_while_pooled_is_replaced_without_an_error(
    server_factory,
) -> None:
    server = server_factory("--request-head-timeout-seconds", "1")
    client = transport(server)
    try:
        assert client.request("GET", "/health").status == 200
        time.sleep(2)  # the server closed the idle connection after 1 s
        assert client.request("POST", "/v1/execute", body=[b"{}"], content_length=2).status
        assert client.request("GET", "/health").status == 200
    finally:
        client.close()
