"""The 503 of an identity past its share of the router's queue (ROUTER §7 step 3) counts
its waiting requests in words that fit the count: with ``--max-queued-requests 2`` the
share is one, and the message read 'you hold 1 requests waiting for a node'."""

from __future__ import annotations

import asyncio

import pytest
from kcoral_server.router.admission.scheduler import Admission, RouterBusy
from kcoral_server.router.nodes.registry import Registry
from kcoral_server.router.settings import RouterSettings


def test_an_identity_holding_its_one_place_is_told_it_holds_one_request() -> None:
    async def scenario() -> str:
        admission = Admission(Registry(RouterSettings()), max_queued=2, wait_timeout=5)
        admission.identities = lambda: 2
        waiting = asyncio.ensure_future(admission.acquire(None, "b1", None, "bob"))
        await asyncio.sleep(0)  # bob's first waits (no node): his one place of two
        try:
            with pytest.raises(RouterBusy) as refused:
                await admission.acquire(None, "b2", None, "bob")
            return str(refused.value)
        finally:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)

    message = asyncio.run(scenario())
    assert message.startswith("router queue: you hold 1 request waiting for a node,"), message
    assert "(half of --max-queued-requests 2)" in message
