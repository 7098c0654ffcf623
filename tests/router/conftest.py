"""The router the fake-node tests of tests/router share: a real ``kcoral router`` process
on loopback that checks node staleness often (0.2 s) and has no restart grace, stopped after
each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from router_helpers import RouterProcess, start_router


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProcess]:
    # An unknown job or session id is 404 at once, not 503 during the restart grace
    # (ROUTER §13; test_router_restart_grace.py keeps the default).
    process = start_router(
        tmp_path, "--status-check-interval-seconds", "0.2", "--reconnect-grace-seconds", "0"
    )
    yield process
    process.stop()
