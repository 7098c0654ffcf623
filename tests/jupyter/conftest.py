"""Real CPU KCoral servers for the Jupyter tests (started with ``server_process``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_process import start_server


@pytest.fixture(scope="session")
def cpu_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One CPU server (two reused workers, pickle allowed) shared by the Jupyter tests."""
    server = start_server(
        tmp_path_factory.mktemp("jupyter-server"),
        ["--log-dir", "", "--num-workers", "2"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    )
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def json_only_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server that refuses pickle payloads."""
    server = start_server(
        tmp_path_factory.mktemp("json-server"),
        ["--log-dir", "", "--num-workers", "1"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json"},
    )
    try:
        yield server.url
    finally:
        server.stop()
