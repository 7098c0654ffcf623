"""The ``%kcoral`` line magics refused by the server (a real one with client tokens, the
kernel holding a wrong token) name the server that answered, as a cell, ``attach`` and
``cancel`` do. Before, ``%kcoral jobs`` and ``%kcoral session start|list|attach`` said
``ServerRefusedError: HTTP 401 unauthorized: ...`` without saying which server refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kcoral_jupyter.cell_errors import ServerRefusedError
from kcoral_shell import kcoral_shell
from server_process import running_server


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("named-refusals")
    tokens = directory / "tokens"
    tokens.write_text("alice token-alice-0123456789\n")
    tokens.chmod(0o600)
    args = ["--log-dir", "", "--auth-token-file", str(tokens)]
    with running_server(directory / "server", args) as server:
        yield server.url


@pytest.fixture
def wrong_token_shell(token_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with kcoral_shell(token_server, monkeypatch, ()) as ip:
        ip.run_line_magic("config", "KCoral.token = 'not-the-token'")
        yield ip


@pytest.mark.parametrize(
    "command",
    [
        "jobs",
        "session start",
        "session list",
        "session attach 0b5e9a7c-0000-4000-8000-000000000002",
    ],
)
def test_a_line_magic_the_server_refuses_names_the_server(
    wrong_token_shell, token_server: str, command: str
) -> None:
    with pytest.raises(ServerRefusedError) as refused:
        wrong_token_shell.run_line_magic("kcoral", command)
    assert refused.value.cause.startswith(f"{token_server} answered HTTP 401 unauthorized")
