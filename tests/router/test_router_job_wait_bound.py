"""A job waited for with a bound through a router that cannot reach it yet (it just
restarted and the job's node has not reconnected: `503`, ROUTER §13) gives up at that bound
with a `TimeoutError` that says why (EXTENSIONS §5). Before, the event stream asked again
each second for 45 s whatever the bound, and `job.result(timeout=2)` returned after 45 s
with the router's `KCoralError 503` (jobs soak). A real router with client tokens, as the
README starts one, and its default restart grace."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from router_helpers import start_router
from server_process import client_token_file

import kcoral

TOKEN = "job-wait-bound-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "job-wait-bound-node-token"}
# an id no node knows: within the restart grace the router answers 503 "not found yet"
UNKNOWN_JOB = "0c8f7a4e-4d7e-4a51-9d55-0000000000aa"
WHY = "job not found yet: the router started"


@pytest.fixture
def router(tmp_path: Path):
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\n")
    process = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)
    yield process
    process.stop()


def test_a_job_waited_for_with_a_bound_through_a_router_that_cannot_reach_it_times_out(router):
    with kcoral.Client(router.url, token=TOKEN) as client:
        with pytest.raises(TimeoutError) as caught:
            client.job(UNKNOWN_JOB).result(timeout=1)
    message = str(caught.value)
    assert message.startswith(f"job {UNKNOWN_JOB} did not finish within 1 s (")
    assert WHY in message


def test_an_async_job_waited_for_with_a_bound_through_a_router_that_cannot_reach_it(router):
    async def wait() -> None:
        async with kcoral.AsyncClient(router.url, token=TOKEN) as client:
            await client.job(UNKNOWN_JOB).result(timeout=1)

    with pytest.raises(TimeoutError) as caught:
        asyncio.run(wait())
    assert str(caught.value).startswith(f"job {UNKNOWN_JOB} did not finish within 1 s (")
    assert WHY in str(caught.value)
