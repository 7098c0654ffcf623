"""``kcoral run`` against a real server that requires a client token, without one and with
a wrong one: the one line says which it was and what to set. Before, it read only ``server
error: HTTP 401: missing or invalid bearer token``, and nothing said that the token comes
from ``KCORAL_TOKEN``, nor whether one was sent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_process import client_token_file, running_server

from kcoral.cli import main as kcoral_main

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("run-refused-token")
    tokens = client_token_file(directory, "dave token-dave-0123456789\n")
    args = ["--log-dir", "", "--auth-token-file", str(tokens)]
    with running_server(directory / "server", args) as server:
        yield server.url


@pytest.mark.parametrize(
    ("token", "line"),
    [
        # a token set without `export` is never sent: it read "missing or invalid bearer
        # token", which sent the user to check a token that was right
        (
            None,
            "the server needs a token (HTTP 401), and KCORAL_TOKEN is unset or empty here: "
            "export KCORAL_TOKEN=<a token it accepts>",
        ),
        (
            "",
            "the server needs a token (HTTP 401), and KCORAL_TOKEN is unset or empty here: "
            "export KCORAL_TOKEN=<a token it accepts>",
        ),
        (
            "not-the-token",
            "the server refused the token in KCORAL_TOKEN (HTTP 401): set KCORAL_TOKEN to a "
            "token it accepts",
        ),
    ],
)
def test_a_refused_token_says_whether_kcoral_token_was_sent_and_what_to_set(
    token_server: str,
    token: str | None,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if token is None:
        monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    else:
        monkeypatch.setenv("KCORAL_TOKEN", token)
    assert kcoral_main(["run", "shell", "--url", token_server, "--", "true"]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"kcoral run: {line}"], said


def test_a_token_pasted_with_its_bearer_word_is_a_usage_error_that_says_to_drop_it(
    token_server: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: a ValueError traceback from the client's constructor, exit 1.
    monkeypatch.setenv("KCORAL_TOKEN", "Bearer token-dave-0123456789")
    assert kcoral_main(["run", "shell", "--url", token_server, "--", "true"]) == 2
    said = capsys.readouterr().err
    assert "Traceback" not in said and "token-dave" not in said, said
    assert said.splitlines()[0] == (
        "kcoral run: error: KCORAL_TOKEN holds a character no bearer token can hold (only "
        "printable ASCII without spaces); give the token alone, without 'Bearer '; the value "
        "is not shown: it may be a secret"
    ), said
    monkeypatch.setenv("KCORAL_TOKEN", "token-dave-0123456789")
    assert kcoral_main(["run", "shell", "--url", token_server, "--", "true"]) == 0
