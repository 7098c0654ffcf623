"""One token holder cannot take a server's descriptors with job event streams (EXTENSIONS
§5): each stream holds one for as long as its job runs, and one holder opening thousands
took them all (attack sweep). An identity holds at most ``CAP`` open at
once (1024, or a quarter of its descriptors where that is fewer); the next gets
``429 too_many_streams``, others are not affected, and a closed stream
frees its place.

The attack, performed: alice opens streams on raw connections that read only the headers,
as an attacker's script would, until the server refuses.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from identity_support import TOKEN_A, TOKEN_B, token_file
from server_process import start_server

import kcoral

pytestmark = pytest.mark.slow
CAP = 64
WAIT = "import os, time\ndef f(go):\n    while not os.path.exists(go):\n        time.sleep(0.05)\n"


def waiting_job(url: str, token: str, go: Path) -> str:
    program = kcoral.Program()
    module = program.upload(kind="module", source=WAIT)
    f = program.get_function(module=module, name="f")
    program.run(fn=f, args=[str(go)])
    with kcoral.Client(url, token=token) as client:
        return client.submit(program).id


def open_stream(url: str, token: str, job_id: str) -> tuple[socket.socket, int, bytes]:
    """A connection that asked for the job's events; its status and what followed it."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        head += chunk
    status = int(head.split(b" ", 2)[1])
    return sock, status, head.split(b"\r\n\r\n", 1)[1]


def test_an_identity_past_its_open_streams_is_refused_and_others_are_not(tmp_path: Path) -> None:
    tokens = token_file(tmp_path / "tokens")
    # 256 descriptors: a quarter, 64, is the cap (the test opens that many sockets)
    server = start_server(
        tmp_path / "server", ["--auth-token-file", str(tokens)], open_files=(256, 256)
    )
    go = tmp_path / "go"
    held: list[socket.socket] = []
    try:
        alices = waiting_job(server.url, TOKEN_A, go)
        bobs = waiting_job(server.url, TOKEN_B, go)
        for _ in range(CAP):
            sock, status, _ = open_stream(server.url, TOKEN_A, alices)
            held.append(sock)
            assert status == 200
        sock, status, rest = open_stream(server.url, TOKEN_A, alices)
        held.append(sock)
        assert status == 429
        while not rest.rstrip().endswith(b"}"):
            rest += sock.recv(4096)
        error = json.loads(rest[rest.index(b"{") :])["error"]
        assert error["kind"] == "too_many_streams"
        assert error["message"].startswith(f"{CAP} job event streams")
        sock, status, _ = open_stream(server.url, TOKEN_B, bobs)  # bob is not affected
        held.append(sock)
        assert status == 200
        held.pop(0).close()  # one of alice's closes: her place comes back
        deadline = time.monotonic() + 30
        while True:
            sock, status, _ = open_stream(server.url, TOKEN_A, alices)
            held.append(sock)
            if status == 200 or time.monotonic() > deadline:
                break
        assert status == 200
    finally:
        go.touch()
        for sock in held:
            sock.close()
        server.stop()
