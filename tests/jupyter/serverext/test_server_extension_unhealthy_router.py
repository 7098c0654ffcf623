"""A server whose ``/health`` says at once that it cannot take work, while its
``/v1/info`` never answers, is shown as it is without waiting for that answer.

A soak (issue 40): a router whose only node stopped answering said 503 ``unavailable`` on
``/health`` at once, but relayed ``/v1/info`` to that node, where it hung until the request
timeout. The servers route waited for both, so every server's card and the status bar kept
showing the router's last ``health ok · 1/1 free`` for those 10 s, each poll. Here the
listener records when its ``/v1/info`` connection opens and when the extension gives it
up: the answer comes while it is still open."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator

import pytest
from traitlets.config import Config

pytestmark = pytest.mark.timeout(120)

UNAVAILABLE = {
    "status": "unavailable",
    "instance_id": "router",
    "started_at": "2026-12-07T17:59:40.371120Z",
    "gpu_count": None,
    "load": {"request_capacity": 0, "requests_in_progress": 0, "requests_waiting": 0},
    "target": {},
    "versions": {},
}


class UnhealthyRouter:
    """Answers ``GET /health`` 503 at once and never answers anything else, recording
    ``("open", path)`` and ``("closed", path)`` for what it leaves unanswered."""

    def __init__(self) -> None:
        self.happened: list[tuple[str, str]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection = self._listener.accept()[0]
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                request += chunk
            path = request.split(b" ")[1].decode()
            if path == "/health":
                body = json.dumps(UNAVAILABLE).encode()
                head = (
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                connection.sendall(head.encode() + body)
                return
            self.happened.append(("open", path))
            while connection.recv(65536):
                pass
            self.happened.append(("closed", path))

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the probe is closed


@pytest.fixture(scope="module")
def router() -> Iterator[UnhealthyRouter]:
    stand_in = UnhealthyRouter()
    yield stand_in
    stand_in.close()


@pytest.fixture
def jp_server_config(router: UnhealthyRouter) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {
                "request_timeout": 10.0,
                "servers": [
                    {"name": "fleet", "url": router.url},
                    {"name": "gone", "url": f"http://127.0.0.1:{_closed_port()}"},
                ],
            },
        }
    )


async def test_a_server_whose_health_fails_at_once_is_shown_without_waiting_for_its_info(
    jp_fetch, router: UnhealthyRouter
) -> None:
    answer = await jp_fetch("kcoral", "api", "servers", request_timeout=60)
    entry = {s["name"]: s for s in json.loads(answer.body)["servers"]}["fleet"]
    assert entry["error"] == "is busy or starting (HTTP 503)", entry
    assert entry["health"] is None and entry["reachable"] is True
    # Asked for its info at the same time, and answered before giving that question up.
    seen = list(router.happened)
    assert ("open", "/v1/info") in seen and ("closed", "/v1/info") not in seen, seen


async def test_the_info_question_left_unawaited_logs_no_error(
    jp_fetch, caplog: pytest.LogCaptureFixture
) -> None:
    # Cancelled instead, each poll of a server that refuses connections logged `[E ...]
    # Exception after Future was cancelled / ConnectionRefusedError` when its /v1/info
    # question failed after the answer had been written.
    answer = await jp_fetch("kcoral", "api", "servers", request_timeout=60)
    gone = {s["name"]: s for s in json.loads(answer.body)["servers"]}["gone"]
    assert gone["error"].startswith("not running: nothing answers at"), gone
    await asyncio.sleep(0.5)  # the refused connection of its /v1/info question fails by then
    assert "Exception after Future was cancelled" not in caplog.text, caplog.text[-2000:]
