"""A DNS-rebinding refusal names the process that answers it: a router says "this router's
address", a server "this server's address" (EXTENSIONS §6). Before, a router's refusal
called it a server, sending its operator to the wrong process's flags."""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_helpers import start_router

REBOUND = "rebind.example"


def _refusal_for(port: int, host: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/health", headers={"Host": host})
        answer = connection.getresponse()
        document = json.loads(answer.read())
    finally:
        connection.close()
    assert answer.status == 403 and document["error"]["kind"] == "forbidden", document
    return document["error"]["message"]


def _refusal(port: int) -> str:
    return _refusal_for(port, f"{REBOUND}:{port}")


def test_a_router_refusing_a_rebound_host_calls_itself_a_router(tmp_path: Path) -> None:
    router = start_router(tmp_path)
    try:
        message = _refusal(router.port)
    finally:
        router.stop()
    assert f"Host '{REBOUND}:{router.port}' is not this router's address" in message, message
    assert "--allowed-host" in message, message


def test_a_server_refusing_a_rebound_host_calls_itself_a_server(kcoral_server) -> None:
    message = _refusal(kcoral_server.port)
    assert "is not this server's address" in message, message


def test_a_client_given_the_listen_all_address_is_told_the_servers_own(kcoral_server) -> None:
    # `kcoral.Client("http://0.0.0.0:8000")` reaches a loopback server on Linux, which then
    # said "a DNS rebinding page?" and sent the user to --allowed-host
    port = kcoral_server.port
    for host in (f"0.0.0.0:{port}", f"[::]:{port}"):
        message = _refusal_for(port, host)
        assert message == (
            f"Host '{host}' is a listen-all address, not one to connect to: use this "
            f"server's own, http://127.0.0.1:{port}"
        ), message


def test_the_client_reading_the_listen_all_address_says_which_to_use(kcoral_server) -> None:
    import kcoral

    with kcoral.Client(f"http://0.0.0.0:{kcoral_server.port}") as client:
        try:
            client.health()
        except kcoral.KCoralError as exc:
            said = str(exc)
        else:
            raise AssertionError("the server answered a listen-all Host")
    assert f"use this server's own, http://127.0.0.1:{kcoral_server.port}" in said, said
