"""Shared fixtures: a real ``kcoral server`` subprocess on loopback.

``kcoral_server`` starts one with test defaults (``--port 0`` + ``--ready-file``,
``--sandbox none``, ``--device cpu``, reused workers, a private ``--disk-cache-dir`` and
``--log-dir`` under ``tmp_path``). Parametrize it indirectly with extra arguments::

    @pytest.mark.parametrize("kcoral_server", [["--num-workers", "2"]], indirect=True)

or use ``server_factory(*args, env=...)`` to start several, or one with special options.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from required_suites import required_prefixes
from server_process import RunningServer, running_server, start_server

# The fork servers' torch preload (SERVER §1) costs each server start ~1.2 s of CPU in the
# background, and the suite starts hundreds on 2 cores: off for the session unless the
# environment says otherwise; tests/server/test_torch_preload.py turns it on by flag.
os.environ.setdefault("KCORAL_WORKER_PRELOAD", "none")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator:
    """``server_factory(*args, env=None, name=None)`` starts a server; all stop at teardown."""
    started: list[RunningServer] = []

    def factory(*args: str, env: dict[str, str] | None = None, name: str | None = None):
        server = start_server(tmp_path / (name or f"server{len(started)}"), args, env=env)
        started.append(server)
        return server

    yield factory
    for server in started:
        server.stop()


@pytest.fixture
def kcoral_server(request: pytest.FixtureRequest, server_factory) -> RunningServer:
    """One server with the test defaults plus ``request.param`` extra arguments."""
    args = list(getattr(request, "param", None) or [])
    return server_factory(*args)


@pytest.fixture(scope="session")
def json_only_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server (one reused worker) started with KCORAL_ALLOWED_SERIALIZATION=json."""
    with running_server(
        tmp_path_factory.mktemp("json-only-server"),
        ["--log-dir", "", "--num-workers", "1"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json"},
    ) as server:
        yield server.url


# ---------------------------------------------------------------- required in CI
# `.ci/run` runs as root with the README's system packages installed: there the suites
# listed in tests/ci_required.txt have no reason to skip, and a skip means a missing
# install step or a broken check. Every skip's reason is shown (`-rs` in pyproject.toml).
_required_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and os.environ.get("CI") and not hasattr(report, "wasxfail"):
        if any(report.nodeid.startswith(prefix) for prefix in required_prefixes()):
            _required_skips.append(f"{report.nodeid}: {report.longrepr[-1]}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _required_skips and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if _required_skips:
        terminalreporter.section("tests that must not skip in CI (tests/ci_required.txt)")
        for line in _required_skips:
            terminalreporter.write_line(f"SKIPPED IN CI: {line}")


# ---------------------------------------------------------------- router and node logs
LOG_TAIL_LINES = 80


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed test's report ends with the tails of the router and node logs written while
    it ran: they live in tmp folders that are gone by the time anyone reads a CI log.

    Any folder's tests may start routers and nodes (``tests/router/router_helpers.py``);
    the helpers are looked up, not imported, so a test that started none pays nothing."""
    report = yield
    helpers = sys.modules.get("router_helpers")
    if helpers is None or not (report.failed and call.when == "call"):
        return report
    for path in helpers.STARTED_LOGS:
        try:
            if path.stat().st_mtime < call.start:
                continue
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError:
            continue
        report.sections.append((f"log {path.name} (last {len(lines)} lines)", "\n".join(lines)))
    return report
