"""Servers that accept connections and never answer (a stopped process, or a server a kernel
connected to that chooses not to answer) hold back no other server's jobs in the panel.

``GET jobs`` asked the servers one after another, where ``servers`` and ``sessions`` ask
them all at once: each silent server held the jobs of every server after it back by the
request timeout (10 s by default), so two made the panel's job list 20 s old. Here the
listeners record when each connection opens and when the extension gives it up: asked at
once, both are open before either is given up."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest
from traitlets.config import Config

pytestmark = pytest.mark.timeout(120)


class Silent:
    """Listeners that accept connections, read what is sent and never answer, recording
    ``("open", name)`` and ``("closed", name)`` in the order they happen."""

    def __init__(self) -> None:
        self.happened: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._stop = threading.Event()

    def listen(self, name: str) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)
        self._listeners.append(listener)
        threading.Thread(target=self._accept, args=(listener, name), daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    def _record(self, what: str, name: str) -> None:
        with self._lock:
            self.happened.append((what, name))

    def _accept(self, listener: socket.socket, name: str) -> None:
        while not self._stop.is_set():
            try:
                connection = listener.accept()[0]
            except OSError:
                continue
            self._record("open", name)
            threading.Thread(target=self._drain, args=(connection, name), daemon=True).start()

    def _drain(self, connection: socket.socket, name: str) -> None:
        with connection:
            while connection.recv(65536):
                pass
        self._record("closed", name)

    def close(self) -> None:
        self._stop.set()
        for listener in self._listeners:
            listener.close()


@pytest.fixture(scope="module")
def silent_servers() -> Iterator[tuple[Silent, list[dict[str, str]]]]:
    silent = Silent()
    servers = [{"name": name, "url": silent.listen(name)} for name in ("first", "second")]
    yield silent, servers
    silent.close()


@pytest.fixture
def jp_server_config(silent_servers: tuple[Silent, list[dict[str, str]]]) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {"request_timeout": 10.0, "servers": silent_servers[1]},
        }
    )


async def test_two_silent_servers_are_asked_for_their_jobs_at_once(
    jp_fetch, silent_servers: tuple[Silent, list[dict[str, str]]]
) -> None:
    silent = silent_servers[0]
    answer = await jp_fetch("kcoral", "api", "jobs", request_timeout=60)
    document = json.loads(answer.body)
    notes = {note["server"]: note["message"] for note in document["errors"]}
    assert set(notes) == {"first", "second"}
    assert all(message.startswith("no answer from") for message in notes.values()), notes
    opened = [step for step in silent.happened if step[0] == "open"]
    assert len(opened) == 2, silent.happened
    # both asked before either was given up (one after another: open, closed, open, closed)
    assert [what for what, _ in silent.happened[:2]] == ["open", "open"], silent.happened
