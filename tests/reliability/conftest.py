"""Servers for the reliability suite: a private ``TMPDIR`` (so workspaces can be counted) and
a resource baseline measured after a warm-up request."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from reliability_support import Launched, launch, warm


@pytest.fixture
def watched_server(tmp_path: Path):
    """``watched_server(*args, env=None, warm_up=True)`` starts a server; all stop at the end."""
    started: list[Launched] = []

    def start(*args: str, env: dict[str, str] | None = None, warm_up: bool = True) -> Launched:
        server = launch(tmp_path / f"server{len(started)}", args, env)
        started.append(server)
        return warm(server) if warm_up else server

    yield start
    for server in started:
        server.stop()


def pytest_terminal_summary(terminalreporter) -> None:
    fuzz = sys.modules.get("test_fuzz")
    if fuzz is not None and fuzz.GENERATED[0]:
        terminalreporter.write_line(
            f"fuzz: {fuzz.GENERATED[0]} generated requests sent to a live server "
            "(tests/reliability/test_fuzz.py)"
        )
