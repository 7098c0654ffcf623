"""``%kcoral connect`` to a server that refuses the kernel's token: a real CPU server with a
client token, the extension in the process's IPython shell.

The connect used to read the server's ``/v1/info`` 401 as "a server without /v1/info", say
``connected to ... (features: )`` and keep those empty features for the kernel's life: after
the token was fixed and the server connected again, cells still ran without the jobs API
(``this server has no jobs API``) and ``%kcoral session start`` said the server offered no
sessions.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from kcoral_jupyter.cell_errors import NotConnectedError, ServerRefusedError
from kcoral_jupyter.extension import kernel_state_of
from kcoral_shell import kcoral_shell
from server_process import client_token_file, running_server

pytestmark = pytest.mark.timeout(300)

TOKEN = "token-carol-0123456789"


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("refused-token")
    tokens = client_token_file(directory, f"carol {TOKEN}\n")
    args = ["--log-dir", "", "--auth-token-file", str(tokens)]
    with running_server(directory / "server", args) as server:
        yield server.url


@pytest.fixture
def shell(token_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with kcoral_shell(token_server, monkeypatch, ()) as ip:
        yield ip


def connect_with_a_wrong_token(shell: Any, url: str) -> ServerRefusedError:
    """``%kcoral connect url`` with a token the server refuses: the error it raises."""
    shell.run_line_magic("config", "KCoral.token = 'not-the-token'")
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_line_magic("kcoral", f"connect {url}")
    return refused.value


def test_a_connect_whose_token_is_refused_fails_and_says_to_set_the_token(
    shell, token_server
) -> None:
    refused = connect_with_a_wrong_token(shell, token_server)
    assert refused.status_code == 401
    assert refused.cause.startswith(f"could not connect: {token_server} answered HTTP 401")
    assert "%config KCoral.token" in refused.action
    with pytest.raises(NotConnectedError):  # no quiet fallback to another server
        shell.run_cell_magic("kcoral", "", "print('never runs')")


def test_the_cell_after_a_refused_connect_says_to_set_the_kernels_token_not_kcoral_token(
    shell, token_server
) -> None:
    # It said "failed (the server at URL refused the token (401): set KCORAL_TOKEN, or pass
    # Client(url, token=...))", then "run %kcoral connect URL again once it answers": the
    # client's advice, which a kernel reads only at the extension's first use.
    connect_with_a_wrong_token(shell, token_server)
    with pytest.raises(NotConnectedError) as unconnected:
        shell.run_cell_magic("kcoral", "", "print('never runs')")
    cause, action = unconnected.value._render_traceback_()
    said = "HTTP 401 unauthorized: the token sent was refused (the server said: "
    shown = f"NotConnectedError: not connected: %kcoral connect {token_server} failed ({said}"
    assert cause.startswith(shown), cause
    assert "set KCORAL_TOKEN" not in cause + action and "once it answers" not in action
    assert action == (
        "set this server's token: %config KCoral.token = '...' (KCORAL_TOKEN is read only at "
        "the extension's first use); then %kcoral connect again"
    )


def test_once_the_token_is_fixed_a_new_connect_sees_the_servers_features(
    shell, token_server
) -> None:
    connect_with_a_wrong_token(shell, token_server)
    shell.run_line_magic("config", f"KCoral.token = {TOKEN!r}")
    shell.run_line_magic("kcoral", f"connect {token_server}")
    features = kernel_state_of(shell).facts(token_server).features
    assert "jobs" in features and "sessions" in features


def test_a_token_pasted_with_its_bearer_word_fails_the_cell_in_two_lines_that_say_so(
    shell, token_server
) -> None:
    # Before: the client's ValueError ("token holds a character ...") left the cell with a
    # traceback through the extension's frames, naming no setting.
    shell.run_line_magic("config", f"KCoral.token = 'Bearer {TOKEN}'")
    with pytest.raises(ValueError) as refused:  # a TokenSettingError is one
        shell.run_cell_magic("kcoral", "", "print('never runs')")
    render = getattr(refused.value, "_render_traceback_", None)
    shown = render() if render else repr(refused.value)
    assert shown == [
        "TokenSettingError: KCoral.token holds a character no bearer token can hold (only "
        "printable ASCII without spaces); give the token alone, without 'Bearer '; the value "
        "is not shown: it may be a secret",
        "%config KCoral.token = '...' sets it (KCORAL_TOKEN is read only at the extension's "
        "first use)",
    ], shown
    shell.run_line_magic("config", f"KCoral.token = {TOKEN!r}")
    shell.run_cell_magic("kcoral", "", "print('runs')")


def cell_refusal(shell: Any) -> list[str]:
    """The lines a cell refused with a 401 shows (its traceback, as IPython renders it)."""
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_cell_magic("kcoral", "", "print('never runs')")
    assert refused.value.status_code == 401
    return refused.value._render_traceback_()


def test_a_cell_sent_without_a_token_says_none_was_sent_and_where_one_is_set(
    shell, token_server
) -> None:
    # Before: "HTTP 401 unauthorized: missing or invalid bearer token" for a token never set
    # and for one the server refused alike.
    shell.run_line_magic("config", "KCoral.token = ''")
    cause, action = cell_refusal(shell)
    said = "no token was sent (the server said: missing or invalid bearer token)"
    shown = f"ServerRefusedError: {token_server} answered HTTP 401 unauthorized: {said}"
    assert re.fullmatch(re.escape(shown) + r" \[request [0-9a-f-]+\]", cause), cause
    assert action == (
        "set this server's token: %config KCoral.token = '...' (KCORAL_TOKEN is read only at "
        "the extension's first use)"
    )


def test_a_cell_whose_token_is_refused_says_the_token_sent_was_refused(shell, token_server) -> None:
    shell.run_line_magic("config", "KCoral.token = 'not-the-token'")
    cause, action = cell_refusal(shell)
    said = "the token sent was refused (the server said: missing or invalid bearer token)"
    shown = f"ServerRefusedError: {token_server} answered HTTP 401 unauthorized: {said}"
    assert re.fullmatch(re.escape(shown) + r" \[request [0-9a-f-]+\]", cause), cause
    assert "not-the-token" not in cause + action
    assert "%config KCoral.token" in action and "KCORAL_TOKEN" in action
