"""A bounded wait for a job whose server is frozen (stopped with SIGSTOP, a hung proxy: it
accepts connections and never answers) still ends with ``TimeoutError`` (EXTENSIONS §5).
Since 77ea204 a wait whose time is up asks the job's state once, so that a finished job is
no timeout; that question had no read timeout, and ``job.result(timeout=1)`` waited for
ever where it had raised at 1 s. A real server, stopped for real."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from job_helpers import module_program
from server_process import RunningServer, start_server

import kcoral

pytestmark = pytest.mark.timeout(300)

SLEEPER = """
import time
def f():
    time.sleep(600)
"""
#: how long a wait that never ends is given before the test says so (a bound, not a time
#: measured: the wait asks for 1 s and its last question is bounded by a few seconds more)
NEVER = 120.0


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[tuple[RunningServer, str]]:
    """A server with a job running on it, then stopped (SIGSTOP) until the test ends."""
    server = start_server(tmp_path / "server", ["--num-workers", "1"])
    try:
        with kcoral.Client(server.url) as client:
            job = client.submit(module_program(SLEEPER, "f"))
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                yield server, job.id
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
                with contextlib.suppress(Exception):
                    job.cancel()
    finally:
        server.stop()


def outcome_of(wait: Callable[[], object]) -> BaseException | None:
    """What ``wait`` raised, or None; ``AssertionError`` when it is still waiting after
    ``NEVER`` seconds (its thread ends once the server answers again)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            wait()
        except BaseException as exc:  # handed to the test, whatever it is
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(NEVER)
    assert not thread.is_alive(), "the bounded wait was still waiting on the frozen server"
    return caught[0] if caught else None


def test_a_bounded_wait_on_a_frozen_server_ends_with_a_timeout(frozen) -> None:
    server, job_id = frozen

    def wait() -> None:
        with kcoral.Client(server.url) as client:
            client.job(job_id).result(timeout=1)

    raised = outcome_of(wait)
    assert isinstance(raised, TimeoutError), repr(raised)
    assert str(raised).startswith(f"job {job_id} did not finish within 1 s"), raised


def test_an_async_bounded_wait_on_a_frozen_server_ends_with_a_timeout(frozen) -> None:
    server, job_id = frozen

    async def wait() -> None:
        async with kcoral.AsyncClient(server.url) as client:
            await client.job(job_id).result(timeout=1)

    raised = outcome_of(lambda: asyncio.run(wait()))
    assert isinstance(raised, TimeoutError), repr(raised)
    assert str(raised).startswith(f"job {job_id} did not finish within 1 s"), raised
