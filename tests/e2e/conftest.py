"""Fixtures of the end-to-end suite: real servers driven by the real ``kcoral`` client.

``e2e_server`` is one two-worker CPU server shared by every test of a module (tests that
would disturb it start their own through ``server_factory``); ``client`` is a fresh
``kcoral.Client`` for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_process import RunningServer, start_server

import kcoral


@pytest.fixture(scope="module")
def e2e_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("e2e-server"), ["--num-workers", "2"])
    yield server
    server.stop()


@pytest.fixture
def client(e2e_server: RunningServer) -> Iterator[kcoral.Client]:
    with kcoral.Client(e2e_server.url) as c:
        yield c
