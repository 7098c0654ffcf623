"""Shared fixtures: a real ``kcoral server`` subprocess on loopback.

``kcoral_server`` starts one with test defaults (``--port 0`` + ``--ready-file``,
``--sandbox none``, ``--device cpu``, reused workers, a private ``--disk-cache-dir`` and
``--log-dir`` under ``tmp_path``). Parametrize it indirectly with extra arguments::

    @pytest.mark.parametrize("kcoral_server", [["--num-workers", "2"]], indirect=True)

or use ``server_factory(*args, env=...)`` to start several, or one with special options.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import RunningServer, running_server, start_server


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
