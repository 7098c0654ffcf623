"""A real CPU KCoral server for the Jupyter tests (``json_only_server_url`` is shared, in
``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_process import running_server


@pytest.fixture(scope="session")
def cpu_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One CPU server (two reused workers, pickle allowed) shared by the Jupyter tests."""
    with running_server(
        tmp_path_factory.mktemp("jupyter-server"),
        ["--log-dir", "", "--num-workers", "2"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    ) as server:
        yield server.url
