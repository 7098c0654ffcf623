"""``health()``, ``target()`` and ``info()`` give up on a server that accepts the request and
never answers (a stopped process, a hung proxy): a ``TransportError`` after
``STATUS_READ_TIMEOUT_SECONDS`` (CLIENT_API §2). Before, they waited for ever, and a
notebook's status cell with them. A real listening socket that reads and never answers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from stand_in_http import silent

import kcoral
import kcoral.base_client
from kcoral.errors import TransportError


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A loopback port whose connections are never answered."""
    with silent() as url:
        yield url


@pytest.fixture(autouse=True)
def short_status_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kcoral.base_client, "STATUS_READ_TIMEOUT_SECONDS", 0.5)


def test_status_calls_of_a_client_give_up_on_a_server_that_never_answers(
    silent_server: str,
) -> None:
    with kcoral.Client(silent_server) as client:
        for call in (client.health, client.target, client.info):
            with pytest.raises(TransportError, match=r"no answer within 0.5 s \(read timeout\)"):
                call()


def test_status_calls_of_an_async_client_give_up_on_a_server_that_never_answers(
    silent_server: str,
) -> None:
    async def ask() -> None:
        async with kcoral.AsyncClient(silent_server) as client:
            for call in (client.health, client.target, client.info):
                with pytest.raises(
                    TransportError, match=r"no answer within 0.5 s \(read timeout\)"
                ):
                    await call()

    asyncio.run(ask())


def test_session_records_give_up_on_a_server_that_never_answers(silent_server: str) -> None:
    # %kcoral status and session list read them: a frozen server held the cell for ever
    with kcoral.Client(silent_server) as client:
        with pytest.raises(TransportError, match=r"no answer within 0.5 s \(read timeout\)"):
            client.attach_session("0f2e3b4c-0000-4000-8000-000000000001")
        with pytest.raises(TransportError, match=r"no answer within 0.5 s \(read timeout\)"):
            client.sessions()
