"""A connection answered before its body was read is closed once the client stops sending
(``front_door.lingering_close``): before, the server closed it at once, the kernel reset it
under the client's next bytes, and a client that sends its whole body before reading lost
the answer (through a router, about 1 too-large upload in 10 came back as a 502)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import pytest
from kcoral_server.front_door import lingering_close
from raw_http import read_until_closed
from server_process import RunningServer, client_token_file, running_server
from tornado.iostream import IOStream

import kcoral

TOKEN = "lingering-test-token"
DECLARED = 64 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("lingering")
    tokens = client_token_file(directory, f"alice {TOKEN}\n")
    with running_server(directory / "server", ["--auth-token-file", str(tokens)]) as running:
        yield running


def upload_head(url: str, token: str, declared: int) -> tuple[socket.socket, bytes]:
    """A connection that sent an ``/execute`` head declaring ``declared`` body bytes, none
    of them yet, and the answer it got (read to the server's FIN)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        b"POST /execute HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {token}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode()
    )
    return sock, read_until_closed(sock, timeout=30)


def send_rest_of_body(sock: socket.socket, size: int = 8 << 20) -> None:
    """What a client that sends before it reads does next: the body, to its end."""
    chunk = bytes(1 << 20)
    for _ in range(size // len(chunk)):
        sock.sendall(chunk)


def test_a_too_large_upload_may_send_the_rest_of_its_body_after_its_413_then_is_closed(
    server: RunningServer,
) -> None:
    sock, answer = upload_head(server.url, TOKEN, 8 * DECLARED)  # over the 256 MiB default
    with sock:
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413") and b"Connection: close" in head
        assert json.loads(payload)["error"]["kind"] == "request_too_large"
        # Before: the socket was closed already, and these bytes were answered by a reset.
        send_rest_of_body(sock)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""  # the server's close, once the client's is seen


def test_a_caller_without_the_token_still_has_its_body_never_read(server: RunningServer) -> None:
    sock, answer = upload_head(server.url, "wrong-token", DECLARED)
    with sock:
        assert answer.startswith(b"HTTP/1.1 401")
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            send_rest_of_body(sock)  # closed at once: no lingering for a refused caller


def test_the_server_keeps_serving_after_early_answers(server: RunningServer) -> None:
    for _ in range(3):
        sock, answer = upload_head(server.url, "wrong-token", DECLARED)
        sock.close()  # a client that leaves at once: its lingering socket ends at once
        assert answer.startswith(b"HTTP/1.1 401")
    program = kcoral.Program()
    program.return_(key="x", value=program.upload(kind="bytes", value=b"still serving"))
    with kcoral.Client(server.url, token=TOKEN) as client:
        assert client.execute(program)["x"] == b"still serving"


# -- the close itself, on a socket pair ----------------------------------------------------


def lingering_pair() -> tuple[IOStream, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.settimeout(10)
    stream = IOStream(ours)
    lingering_close.linger_on_close(stream)
    return stream, theirs


def test_a_lingering_socket_half_closes_reads_away_and_closes_when_the_peer_does() -> None:
    async def scenario() -> None:
        stream, peer = lingering_pair()
        stream.close()
        assert peer.recv(1) == b""  # the FIN after the answer
        assert lingering_close.lingering_count() == 1
        await asyncio.to_thread(peer.sendall, bytes(4 << 20))  # read away, never a reset
        peer.shutdown(socket.SHUT_WR)
        for _ in range(200):
            if lingering_close.lingering_count() == 0:
                break
            await asyncio.sleep(0.01)
        assert lingering_close.lingering_count() == 0
        peer.close()

    asyncio.run(scenario())


def test_a_silent_peer_is_not_waited_for_and_the_bound_closes_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        monkeypatch.setattr(lingering_close, "IDLE_SECONDS", 0.05)
        stream, peer = lingering_pair()
        stream.close()
        ended = asyncio.get_running_loop().time() + 10
        while lingering_close.lingering_count() and asyncio.get_running_loop().time() < ended:
            await asyncio.sleep(0.01)
        assert lingering_close.lingering_count() == 0  # ended by its idle timer
        peer.close()
        monkeypatch.setattr(lingering_close, "MAX_LINGERING", 0)
        stream, peer = lingering_pair()
        stream.close()
        assert lingering_close.lingering_count() == 0  # over the bound: closed at once
        assert peer.recv(1) == b""
        peer.close()

    asyncio.run(scenario())
