"""``%kcoral connect`` to a real server's address with a path pasted after it
(``http://127.0.0.1:PORT/v1``), the extension in the process's IPython shell. Every KCoral
server answers ``/health``, so a 404 there means the path is wrong; the connect's second line
said ``%kcoral jobs lists the jobs this server keeps for you``, the hint for a job's 404."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kcoral_jupyter.cell_errors import ServerRefusedError
from kcoral_shell import kcoral_shell
from server_process import running_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("address-with-a-path")
    with running_server(directory / "server", ["--log-dir", ""]) as running:
        yield running.url


@pytest.fixture
def shell(server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with kcoral_shell(server, monkeypatch, ()) as ip:
        yield ip


def test_a_connect_under_a_pasted_path_says_to_give_the_servers_own_address(shell, server) -> None:
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_line_magic("kcoral", f"connect {server}/v1")
    assert refused.value.status_code == 404
    assert refused.value.action == (
        f"no KCoral server answers under the path /v1: give the server's own address, {server} "
        "(a path only where a proxy serves it there); then %kcoral connect again (until then "
        "cells refuse to run)"
    )
    shell.run_line_magic("kcoral", f"connect {server}")


def test_a_cell_sent_under_a_pasted_path_says_to_give_the_servers_own_address(
    shell, server
) -> None:
    # `%%kcoral --url URL/v1`: its 404 said "%kcoral jobs lists the jobs this server keeps
    # for you", as the connect's did.
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_cell_magic("kcoral", f"--url {server}/v1", "print('never runs')")
    assert refused.value.status_code == 404
    assert refused.value.action == (
        f"no KCoral server answers under the path /v1: give the server's own address, {server} "
        "(a path only where a proxy serves it there)"
    )
