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


def _refusal(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/health", headers={"Host": f"{REBOUND}:{port}"})
        answer = connection.getresponse()
        document = json.loads(answer.read())
    finally:
        connection.close()
    assert answer.status == 403 and document["error"]["kind"] == "forbidden", document
    return document["error"]["message"]


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
