"""A remote function's call that runs past its deadline (the server's 504 ``timeout``) says
which setting set it in the words the user wrote, ``timeout=`` of the decorator (CLIENT_API
§8); the server's message named ``timeout_seconds`` and ``--max-timeout-seconds``, which the
user of a remote function never wrote."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from server_process import client_token_file, running_server

from kcoral import AsyncClient, Client
from kcoral.errors import KCoralError


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A CPU server with a client token, a 2 s default deadline and a 4 s longest one."""
    directory = tmp_path_factory.mktemp("deadlines")
    token = secrets.token_hex(16)
    tokens = client_token_file(directory, token + "\n")
    args = ["--auth-token-file", str(tokens)]
    args += ["--default-timeout-seconds", "2", "--max-timeout-seconds", "4"]
    with running_server(directory, args) as running:
        yield running.url, token


def stuck() -> None:
    import time

    time.sleep(60)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            {"timeout": 1},
            "deadline of 1 s (stuck()'s timeout=1; @client.function(timeout=...) raises it)",
        ),
        (
            {},
            "deadline of 2 s (the server's default, as stuck() sets no timeout; "
            "@client.function(timeout=...) sets one)",
        ),
        ({"timeout": 30}, "deadline of 4 s (the server's most; stuck() asked for timeout=30)"),
    ],
)
def test_a_call_past_its_deadline_names_the_setting_as_the_user_wrote_it(
    server: tuple[str, str], options: dict[str, Any], said: str
) -> None:
    url, token = server
    with Client(url, token=token) as client:
        function = client.function(**options)(stuck)
        with pytest.raises(KCoralError) as caught:
            function.remote()
    assert (caught.value.status_code, caught.value.kind) == (504, "timeout")
    assert str(caught.value) == f"HTTP 504: execution timed out after its {said}"
    assert "timeout_seconds" not in str(caught.value)


def test_an_async_call_and_a_sessions_function_say_it_too(server: tuple[str, str]) -> None:
    url, token = server

    async def call() -> None:
        async with AsyncClient(url, token=token) as client:
            await client.function(timeout=1, serialization="pickle")(stuck).remote()

    with pytest.raises(KCoralError) as caught:
        asyncio.run(call())
    assert str(caught.value).endswith(
        "(stuck()'s timeout=1; @client.function(timeout=...) raises it)"
    )
    with Client(url, token=token) as client, client.session() as session:
        with pytest.raises(KCoralError) as caught:
            session.function(timeout=1)(stuck).remote()
    assert str(caught.value).endswith(
        "(stuck()'s timeout=1; @session.function(timeout=...) raises it)"
    )


def test_other_http_errors_pass_unchanged(server: tuple[str, str]) -> None:
    url, _ = server
    with Client(url, token="not-the-token") as client:
        with pytest.raises(KCoralError) as caught:
            client.function(timeout=1)(stuck).remote()
    assert caught.value.status_code == 401
