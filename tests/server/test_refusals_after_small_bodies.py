"""A refused request with a small body is answered once that body has arrived (SERVER, the
front door's early refusals): closing a socket with unread bytes resets the connection, and
a reset can destroy the answer before the client reads it. A routed session's ``410`` once
reached its client as a broken response that way; here every such answer arrives whole, the
connection stays usable, and a small body that never comes is refused at its deadline."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from raw_http import call_program, connection, execute_body, read_until_closed
from server_process import RunningServer, running_server

TOKEN = "refusal-test-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("refusals")
    tokens = directory / "tokens"
    tokens.write_text(f"alice {TOKEN}\n")
    tokens.chmod(0o600)
    args = ["--auth-token-file", str(tokens), "--body-timeout-seconds", "1"]
    with running_server(directory / "server", args) as running:
        yield running


def headers(content_type: str, body: bytes, **more: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {TOKEN}",
        "Content-Type": content_type,
        "Content-Length": str(len(body)),
        **more,
    }


def test_an_ended_sessions_program_always_gets_its_whole_410(server: RunningServer) -> None:
    link = connection(server.url)
    link.request("POST", "/v1/sessions", body=b"{}", headers=headers("application/json", b"{}"))
    session_id = json.loads(link.getresponse().read())["session_id"]
    link.request(
        "DELETE", f"/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    link.getresponse().read()
    content_type, body = execute_body(call_program("def main():\n    return 1\n"))
    for _attempt in range(40):  # the reset lost about one answer in ten through a router
        fresh = connection(server.url)
        fresh.request(
            "POST",
            f"/v1/sessions/{session_id}/execute",
            body=body,
            headers=headers(content_type, body),
        )
        answer = fresh.getresponse()
        assert answer.status == 410
        assert json.loads(answer.read())["error"]["kind"] == "session_ended"
        fresh.close()


def test_a_refused_small_body_leaves_the_connection_open_for_the_next_request(
    server: RunningServer,
) -> None:
    content_type, body = execute_body(call_program("def main():\n    return 1\n"))
    link = connection(server.url)
    refused = headers(content_type, body, **{"X-KCoral-Serialization": "yaml"})
    link.request("POST", "/execute", body=body, headers=refused)
    answer = link.getresponse()
    assert answer.status == 400 and json.loads(answer.read())["error"]["kind"] == "parse"
    assert answer.headers.get("Connection") != "close"
    link.request("POST", "/execute", body=body, headers=headers(content_type, body))
    answer = link.getresponse()
    assert answer.status == 200  # the same connection serves the next request
    answer.read()


def test_a_small_body_that_never_arrives_is_refused_at_its_deadline(
    server: RunningServer,
) -> None:
    host, port = server.url.split("://", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /execute HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n".encode()
            + b"X-KCoral-Serialization: yaml\r\nContent-Type: application/json\r\n"
            + b"Content-Length: 100\r\n\r\n"
        )
        answer = read_until_closed(sock, timeout=30)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head
    assert json.loads(payload)["error"]["kind"] == "parse"
