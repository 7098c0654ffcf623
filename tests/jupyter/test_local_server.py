"""The embedded local server: started on demand, advertised, stopped with the kernel."""

from __future__ import annotations

import pytest
from kcoral_jupyter.local_server import LocalServer, advertised_servers

from kcoral import Client

pytestmark = pytest.mark.timeout(180)


def test_the_local_server_starts_advertises_itself_and_stops(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    server = LocalServer(
        ["--device", "cpu", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""]
    )
    try:
        url = server.start()
        assert server.start() == url  # idempotent
        assert Client(url).health()["status"] == "ok"
        assert [record["url"] for record in advertised_servers()] == [url]
    finally:
        assert server.stop()
    assert not server.running
    assert advertised_servers() == []
    assert not server.stop()


def test_a_stale_advertisement_is_ignored(tmp_path, monkeypatch) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    (runtime / "kcoral-local-1.json").write_text('{"url": "http://x", "pid": 999999999}')
    assert advertised_servers() == []
