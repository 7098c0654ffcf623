"""Issue 28 point 1 against a real ``kcoral server``: a connection that sends nothing, or only
part of a request head, is closed at ``--request-head-timeout-seconds`` (Tornado waited 60 s,
the body timeout, before); so is a kept-alive connection idle that long; and the server and
its workers take all the descriptors the hard limit allows.

Anyone who reaches the port can open connections before a token is checked.
"""

from __future__ import annotations

import resource
import socket
from collections.abc import Iterator

import psutil
import pytest
from raw_http import read_until_closed
from server_process import RunningServer, start_server

GENEROUS_SECONDS = 30.0  # far past the 1 s deadline these servers run with
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("head-deadline"),
        ["--request-head-timeout-seconds", "1", "--num-workers", "1"],
        open_files=(256, None),
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize(
    "sent",
    [b"", b"G", b"POST /v1/execute HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n"],
    ids=["nothing", "one-byte", "half-a-head"],
)
def test_a_connection_without_a_complete_request_head_is_closed_at_the_deadline(
    server: RunningServer, sent: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as attacker:
        attacker.sendall(sent)
        assert read_until_closed(attacker, GENEROUS_SECONDS) == b""  # closed, with no answer
    with socket.create_connection(("127.0.0.1", server.port)) as client:
        client.sendall(HEALTH)
        client.settimeout(GENEROUS_SECONDS)
        assert client.recv(65536).startswith(b"HTTP/1.1 200 ")  # still serving


def test_a_kept_alive_connection_idle_past_the_deadline_is_closed(server: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as client:
        client.sendall(HEALTH)
        client.settimeout(GENEROUS_SECONDS)
        answer = client.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ")
        # nothing more is asked: closed after 1 s idle
        rest = read_until_closed(client, GENEROUS_SECONDS)
        assert b"HTTP/1.1" not in rest


def test_the_server_and_its_workers_raise_their_soft_descriptor_limit(
    server: RunningServer,
) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"this machine's hard limit ({hard}) leaves nothing to raise")
    processes = [psutil.Process(server.process.pid)]
    processes += processes[0].children(recursive=True)
    assert len(processes) > 1, "the server started no worker"
    for process in processes:
        soft, hard_seen = process.rlimit(psutil.RLIMIT_NOFILE)
        assert soft == hard_seen, process.cmdline()
        assert soft != 256
