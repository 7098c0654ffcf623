"""A real CPU KCoral server for the `kcoral run` end-to-end tests (one per test module)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_START_SECONDS = 90


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a fresh `kcoral server --device cpu` on a free loopback port."""
    if importlib.util.find_spec("kcoral_server.main") is None:
        pytest.skip("the server (kcoral_server.main) is not available in this checkout")
    base = tmp_path_factory.mktemp("run-server")
    ready = base / "ready"
    log = (base / "server.log").open("wb")
    command = [
        sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
        "--ready-file", str(ready), "--sandbox", "none", "--log-dir", "",
        "--disk-cache-dir", str(base / "disk-cache"), "--max-requests-per-worker", "0",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + _START_SECONDS
        while not (ready.exists() and ready.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                output = (base / "server.log").read_text(errors="replace")[-4000:]
                pytest.fail(f"the server did not start (exit {process.poll()}):\n{output}")
            time.sleep(0.05)
        yield ready.read_text().strip()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test from an empty temporary directory, with no KCORAL_URL around."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KCORAL_URL", raising=False)
    return tmp_path
