"""``@client.function`` (and ``@session.function``) written without its parentheses, against
a real server: a ``TypeError`` that says to add them. Before, Python's own ``BaseClient.
function() takes 1 positional argument but 2 were given`` named neither the decorator form
nor the fix (README and CLIENT_API §8 write ``@client.function(timeout=60)``)."""

from __future__ import annotations

import asyncio

import pytest

from kcoral import AsyncClient, Client


def add_one(x: int) -> int:
    return x + 1


def test_a_client_function_without_parentheses_says_to_add_them(json_only_server_url) -> None:
    sync_client, async_client = Client(json_only_server_url), AsyncClient(json_only_server_url)
    try:
        for client in (sync_client, async_client):
            with pytest.raises(TypeError) as refused:
                client.function(add_one)  # what @client.function does to the function below
            assert str(refused.value) == (
                "write @client.function() with its parentheses (it takes only options)"
            )
    finally:
        sync_client.close()
        asyncio.run(async_client.aclose())


def test_a_session_function_without_parentheses_says_to_add_them(json_only_server_url) -> None:
    with Client(json_only_server_url) as client, client.session() as session:
        with pytest.raises(TypeError) as refused:
            session.function(add_one)
        assert str(refused.value) == (
            "write @session.function() with its parentheses (it takes only options)"
        )
        assert session.function()(add_one)(1) == 2  # with them, as before
