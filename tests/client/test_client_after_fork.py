"""A client made before ``os.fork()`` works in the child, on connections of the child's own.

A forked child (``multiprocessing``'s default on Linux) inherits the parent's pooled
keep-alive sockets, which are the same TCP connections, and its thread pools without their
threads. Before, the child sent its requests on its parent's connections (a parent and a
child calling at once read each other's answers: a parent's ``GET /health`` got the child's
``/v1/info`` answer), and an ``AsyncClient`` or a sync client's ``run_async`` call in the
child waited for a pool thread the child did not have, for ever. Real server on loopback.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from typing import Any

import psutil
import pytest

from kcoral import AsyncClient, Client

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")

#: a child that hangs is stopped after this long (a guard, not a measurement)
HANG_GUARD_SECONDS = 60


def local_ports_towards(port: int) -> set[int]:
    """Local ports of this process's open TCP connections to ``port`` on loopback."""
    return {
        connection.laddr.port
        for connection in psutil.Process().net_connections(kind="tcp")
        if connection.raddr
        and connection.raddr.port == port
        and connection.status == psutil.CONN_ESTABLISHED
    }


def run_in_forked_child(work: Any) -> Any:
    """``work()`` in a forked child; its value, or the exception it raised, comes back."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send(("value", work()))
        except BaseException as exc:  # reported to the parent, which fails the test
            send.send(("error", repr(exc)))

    process = context.Process(target=child)
    process.start()
    send.close()
    try:
        if not receive.poll(HANG_GUARD_SECONDS):
            pytest.fail("the client hung in the forked child")
        outcome, value = receive.recv()
    finally:
        process.kill()
        process.join()
    assert outcome == "value", value
    return value


def test_a_forked_child_sends_its_requests_on_connections_of_its_own(kcoral_server):
    with Client(kcoral_server.url) as client:
        assert client.health()["status"] == "ok"  # a connection now waits in the pool
        parent_ports = local_ports_towards(kcoral_server.port)
        assert parent_ports

        def child_request() -> tuple[int, set[int]]:
            answer = client.request("GET", "/v1/info")
            return answer.status, local_ports_towards(kcoral_server.port)

        status, child_ports = run_in_forked_child(child_request)
        assert status == 200
        assert child_ports and child_ports.isdisjoint(parent_ports)
        assert client.health()["status"] == "ok"  # the parent's connection still serves it


def test_an_async_client_used_before_a_fork_answers_in_the_child(kcoral_server):
    client = AsyncClient(kcoral_server.url)
    assert asyncio.run(client.health())["status"] == "ok"  # its transport threads exist

    def child_health() -> str:
        return str(asyncio.run(client.health())["status"])

    assert run_in_forked_child(child_health) == "ok"
    asyncio.run(client.aclose())


def add_one(x):
    return x + 1


def test_a_sync_clients_run_async_call_made_before_a_fork_answers_in_the_child(kcoral_server):
    with Client(kcoral_server.url) as client:
        remote_add_one = client.function()(add_one)
        assert asyncio.run(remote_add_one.remote(1, run_async=True)) == 2

        def child_call() -> int:
            return int(asyncio.run(remote_add_one.remote(41, run_async=True)))

        assert run_in_forked_child(child_call) == 42
