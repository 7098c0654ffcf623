"""Real CPU KCoral servers for the remote-function end-to-end tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_START_SECONDS = 90


def _start(base: Path, workers: int, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    if importlib.util.find_spec("kcoral_server.main") is None:
        pytest.skip("the server (kcoral_server.main) is not available in this checkout")
    ready = base / "ready"
    log_path = base / "server.log"
    command = [
        sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
        "--ready-file", str(ready), "--sandbox", "none", "--log-dir", "",
        "--disk-cache-dir", str(base / "disk-cache"), "--max-requests-per-worker", "0",
        "--num-workers", str(workers),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    deadline = time.monotonic() + _START_SECONDS
    while not (ready.exists() and ready.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process)
            output = log_path.read_text(errors="replace")[-4000:]
            pytest.fail(f"the server did not start (exit {process.poll()}):\n{output}")
        time.sleep(0.05)
    return process, ready.read_text().strip()


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server with 4 reused workers allowing both formats."""
    env = {"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"}
    process, url = _start(tmp_path_factory.mktemp("remote-server"), 4, env)
    try:
        yield url
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def json_only_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server started with KCORAL_ALLOWED_SERIALIZATION=json."""
    env = {"KCORAL_ALLOWED_SERIALIZATION": "json"}
    process, url = _start(tmp_path_factory.mktemp("remote-json-only"), 1, env)
    try:
        yield url
    finally:
        _stop(process)
