"""Real CPU KCoral servers for the remote-function end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_process import start_server


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server with 4 reused workers allowing both formats."""
    server = start_server(
        tmp_path_factory.mktemp("remote-server"),
        ["--log-dir", "", "--num-workers", "4"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    )
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def json_only_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server started with KCORAL_ALLOWED_SERIALIZATION=json."""
    server = start_server(
        tmp_path_factory.mktemp("remote-json-only"),
        ["--log-dir", "", "--num-workers", "1"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json"},
    )
    try:
        yield server.url
    finally:
        server.stop()
