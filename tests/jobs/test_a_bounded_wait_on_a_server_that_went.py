"""A bounded wait for a job whose server went away (killed: its port refuses connections)
ends with ``TimeoutError`` at its bound, saying why (EXTENSIONS §5), as it does for a
frozen server and a router's ``503``. The event stream reopened a refused connection with
its whole back-off (8 tries, about 9 s) whatever the wait's bound, so ``result(timeout=2)``
raised ``TransportError`` after 9 s. A real server, killed for real."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from job_helpers import module_program
from server_process import start_server

import kcoral

SLEEPER = """
import time
def f():
    print("started", flush=True)
    time.sleep(60)
"""


def a_job_whose_server_went(tmp_path: Path) -> tuple[str, str]:
    """(the server's URL, a job id) of a job that ran there until the server was killed."""
    server = start_server(tmp_path / "server", ["--num-workers", "1"])
    try:
        with kcoral.Client(server.url) as client:
            job = client.submit(module_program(SLEEPER, "f", returns=False))
            for event in job.events():
                if event.kind == "stdout":
                    break
    finally:
        server.stop(signal.SIGKILL)
    return server.url, job.id


def test_a_bounded_wait_for_a_job_whose_server_went_times_out_saying_why(
    tmp_path: Path,
) -> None:
    url, job_id = a_job_whose_server_went(tmp_path)
    with kcoral.Client(url) as client:
        with pytest.raises(TimeoutError) as waited:
            client.job(job_id).result(timeout=2)
    assert str(waited.value).startswith(
        f"job {job_id} did not finish within 2 s (cannot reach {url}: connection refused"
    )


def test_an_async_bounded_wait_for_a_job_whose_server_went_times_out_saying_why(
    tmp_path: Path,
) -> None:
    url, job_id = a_job_whose_server_went(tmp_path)

    async def wait() -> None:
        async with kcoral.AsyncClient(url) as client:
            await client.job(job_id).result(timeout=2)

    with pytest.raises(TimeoutError) as waited:
        asyncio.run(wait())
    assert str(waited.value).startswith(
        f"job {job_id} did not finish within 2 s (cannot reach {url}: connection refused"
    )
