"""Real CPU KCoral servers and an in-process IPython shell for the Jupyter tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_START_SECONDS = 90


def start_cpu_server(base: Path, *, env: dict[str, str] | None = None, workers: int = 2):
    """``kcoral server`` with the test defaults; returns (process, url)."""
    base.mkdir(parents=True, exist_ok=True)
    ready = base / "ready"
    log_path = base / "server.log"
    command = [
        sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
        "--ready-file", str(ready), "--sandbox", "none", "--log-dir", "",
        "--disk-cache-dir", str(base / "disk-cache"), "--max-requests-per-worker", "0",
        "--num-workers", str(workers),
    ]  # fmt: skip
    full_env = {**os.environ, **(env or {})}
    full_env.pop("KCORAL_AUTH_TOKEN", None)
    full_env.update(env or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    deadline = time.monotonic() + _START_SECONDS
    while not (ready.exists() and ready.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            pytest.fail("the server did not start:\n" + log_path.read_text(errors="replace"))
        time.sleep(0.05)
    return process, ready.read_text().strip()


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def cpu_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One CPU server (two reused workers, pickle allowed) shared by the Jupyter tests."""
    process, url = start_cpu_server(
        tmp_path_factory.mktemp("jupyter-server"),
        env={"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    )
    try:
        yield url
    finally:
        stop_server(process)


@pytest.fixture(scope="session")
def json_only_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server that refuses pickle payloads."""
    process, url = start_cpu_server(
        tmp_path_factory.mktemp("json-server"),
        env={"KCORAL_ALLOWED_SERIALIZATION": "json"},
        workers=1,
    )
    try:
        yield url
    finally:
        stop_server(process)
