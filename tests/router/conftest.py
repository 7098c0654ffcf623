"""The router the fake-node tests of tests/router share: a real ``kcoral router`` process
on loopback that checks node staleness often (0.2 s), stopped after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from router_helpers import STARTED_LOGS, RouterProcess, start_router

LOG_TAIL_LINES = 80


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProcess]:
    process = start_router(tmp_path, "--status-check-interval-seconds", "0.2")
    yield process
    process.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed test's report ends with the tails of the router and node logs written while
    it ran: they live in tmp folders that are gone by the time anyone reads a CI log."""
    report = yield
    if report.failed and call.when == "call":
        started = call.start
        for path in STARTED_LOGS:
            try:
                if path.stat().st_mtime < started:
                    continue
                lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            except OSError:
                continue
            report.sections.append((f"log {path.name} (last {len(lines)} lines)", "\n".join(lines)))
    return report
