"""A real CPU KCoral server for the remote-function end-to-end tests (``json_only_server_url``
is shared, in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_process import running_server


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server with 4 reused workers allowing both formats."""
    with running_server(
        tmp_path_factory.mktemp("remote-server"),
        ["--log-dir", "", "--num-workers", "4"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    ) as server:
        yield server.url
