"""A real CPU KCoral server for the `kcoral run` end-to-end tests (one per test module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import running_server


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a fresh `kcoral server --device cpu` on a free loopback port."""
    with running_server(tmp_path_factory.mktemp("run-server"), ["--log-dir", ""]) as server:
        yield server.url


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test from an empty temporary directory, with no KCORAL_URL around."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KCORAL_URL", raising=False)
    return tmp_path
