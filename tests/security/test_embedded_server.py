"""The notebook's embedded server is never token-less, and tokens follow their URL (16.1).

Attackers: a *web page* or any *local process* reaching the embedded server's loopback port
(it must present a token it cannot learn: not on the command line, only in a 0600 file in a
0700 directory), and a *server* the user connects to (it must never receive another
server's token). Real ``kcoral server`` children started through ``LocalServer`` /
``KernelState``; a small recording HTTP server stands in for the user's remote server.
"""

from __future__ import annotations

import http.client
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from kcoral_jupyter.kernel_state import KernelState
from kcoral_jupyter.local_server import LocalServer, advertised_servers
from kcoral_jupyter.settings import KCoral
from stand_in_http import StandIn, serving

import kcoral
from kcoral import Client

pytestmark = pytest.mark.timeout(180)

LOCAL_ARGS = ["--device", "cpu", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""]
REMOTE_TOKEN = "the-users-remote-token"


def status_of(url: str, path: str, token: str | None = None) -> int:
    """One GET on a fresh connection (a pooled one might outlive a stopped server)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connection = http.client.HTTPConnection(url.split("://", 1)[1], timeout=60)
    try:
        connection.request("GET", path, headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "runtime"  # does not exist yet: LocalServer creates it
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def local(runtime: Path) -> Iterator[LocalServer]:
    server = LocalServer(LOCAL_ARGS)
    try:
        yield server
    finally:
        server.stop()


def test_the_embedded_server_refuses_a_request_without_its_token(local: LocalServer):
    url = local.start()
    assert local.token and len(local.token) >= 32
    assert status_of(url, "/v1/info") == 401
    assert status_of(url, "/v1/jobs", "guessed") == 401
    assert status_of(url, "/v1/info", local.token) == 200
    assert Client(url, token=local.token).info()["features"]


def test_the_embedded_token_is_never_on_a_command_line(local: LocalServer):
    local.start()
    assert local.process is not None
    command_line = Path(f"/proc/{local.process.pid}/cmdline").read_bytes()
    assert local.token.encode() not in command_line
    assert b"--auth-token-file" not in command_line


def test_the_advertisement_is_owner_only_and_holds_the_token(local: LocalServer, runtime: Path):
    url = local.start()
    assert local.advert is not None
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert stat.S_IMODE(local.advert.stat().st_mode) == 0o600
    [record] = advertised_servers()
    assert record["url"] == url and record["token"] == local.token
    assert not list(runtime.glob("*.tmp")), "a temporary advertisement was left behind"


def test_nothing_is_advertised_in_a_runtime_directory_others_may_write(
    local: LocalServer, runtime: Path
):
    runtime.mkdir()
    runtime.chmod(0o777)
    url = local.start()
    assert local.advert is None and list(runtime.iterdir()) == []
    assert status_of(url, "/v1/info", local.token) == 200  # the kernel still uses it


def test_each_start_makes_a_fresh_token(local: LocalServer):
    local.start()
    first = local.token
    local.stop()
    assert local.token is None
    url = local.start()
    assert local.token != first
    assert status_of(url, "/v1/info", first) == 401


class Recorder(StandIn):
    """The user's "remote" server: answers /health and /v1/info, remembers what it got."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        if self.path == "/health":
            body = {
                "status": "ok",
                "instance_id": "remote",
                "started_at": "2026-12-01T00:00:00.000000Z",
                "gpu_count": 0,
                "load": {"request_capacity": 1, "requests_in_progress": 0, "requests_waiting": 0},
                "target": {},
                "versions": {},
            }
        else:
            body = {
                "kcoral": kcoral.__version__,
                "protocol": 1,
                "features": [],
                "device": "cpu",
                "limits": {},
            }
        self.send_json(body)


@pytest.fixture
def remote() -> Iterator[str]:
    Recorder.seen = []
    with serving(Recorder) as url:
        yield url


def test_tokens_follow_their_url(runtime: Path, remote: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KCORAL_TOKEN", REMOTE_TOKEN)  # what the embedded server must not get
    settings = KCoral(url=remote, token=REMOTE_TOKEN, local_args=LOCAL_ARGS)
    kernel = KernelState(settings, announce=lambda text: None)
    try:
        assert kernel.client(kernel.resolve_url()).health()["status"] == "ok"
        local_url = kernel.start_local()
        local = kernel.local
        assert local is not None and local.process is not None
        # A 401 would raise here: the local server got its own token, not the user's.
        assert kernel.client(local_url).info()["features"]
        assert kernel.token_for(local_url) == local.token != REMOTE_TOKEN
        assert kernel.token_for(remote) == REMOTE_TOKEN
        kernel.client(remote).info()
        assert Recorder.seen and set(Recorder.seen) == {f"Bearer {REMOTE_TOKEN}"}
        environment = Path(f"/proc/{local.process.pid}/environ").read_bytes()
        assert REMOTE_TOKEN.encode() not in environment
    finally:
        kernel.close()
