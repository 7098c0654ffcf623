"""The router the fake-node tests of tests/router share: a real ``kcoral router`` process
on loopback that checks node staleness often (0.2 s), stopped after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from router_helpers import RouterProcess, start_router


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProcess]:
    process = start_router(tmp_path, "--status-check-interval-seconds", "0.2")
    yield process
    process.stop()
