"""``Job.result(timeout=...)`` and ``wait`` take seconds, ``None`` or infinity (no bound) in
both flavours, and refuse anything else before a request is sent (EXTENSIONS §5).

Before, the sync client turned ``timeout=float("inf")`` into ``OverflowError: timestamp out
of range for platform time_t`` (the async one waited), a string failed inside the arithmetic
(``unsupported operand type(s) for +: 'float' and 'str'``) and ``-1`` or NaN said the job
``did not finish within -1 s``.
"""

from __future__ import annotations

import asyncio
import math
import sys

import pytest
from job_helpers import module_program

import kcoral

QUICK = """
def f():
    return 7
"""

SLEEPER = """
import time
def f():
    time.sleep(600)
"""

REFUSED = [
    ("5", TypeError, "timeout must be a number of seconds or None, not str"),
    (True, TypeError, "timeout must be a number of seconds or None, not bool"),
    (-1, ValueError, "timeout must be a number of seconds >= 0, not -1"),
    (math.nan, ValueError, "timeout must be a number of seconds >= 0, not nan"),
]


def test_a_job_waited_for_without_bound_or_with_a_bad_timeout(kcoral_server) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(QUICK, "f"))
        for timeout, error, message in REFUSED:
            with pytest.raises(error) as caught:
                job.result(timeout=timeout)  # type: ignore[arg-type]
            assert str(caught.value) == message
        assert job.result(timeout=math.inf)["r"] == 7


def test_an_async_job_waited_for_without_bound_or_with_a_bad_timeout(kcoral_server) -> None:
    async def run() -> int:
        async with kcoral.AsyncClient(kcoral_server.url) as client:
            job = await client.submit(module_program(QUICK, "f"))
            for timeout, error, message in REFUSED:
                with pytest.raises(error) as caught:
                    await job.result(timeout=timeout)  # type: ignore[arg-type]
                assert str(caught.value) == message
            return (await job.result(timeout=math.inf))["r"]

    assert asyncio.run(run()) == 7


def test_a_job_waited_for_longer_than_the_platform_can_count_waits_without_bound(
    kcoral_server,
) -> None:
    # 1e10 s (sys.maxsize, "a very long time") overflowed the socket's read timeout as
    # infinity did: 'OverflowError: timestamp out of range for platform time_t'.
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(QUICK, "f"))
        assert job.result(timeout=1e10)["r"] == 7
        assert job.result(timeout=sys.maxsize)["r"] == 7
        assert job.result(timeout=10**400)["r"] == 7  # math.isnan overflowed on it


def test_a_finished_jobs_result_with_no_time_to_wait_is_its_result(kcoral_server) -> None:
    # `result(timeout=0)` asks "is it there yet?", as concurrent.futures' does: a job that
    # had finished raised TimeoutError ("did not finish within 0 s"), its result unread
    # (jobs soak). One that has not finished still raises.
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(QUICK, "f"))
        job.wait()
        again = client.job(job.id)  # re-attached, as from another process
        assert again.result(timeout=0)["r"] == 7
        assert again.result(timeout=1e-9)["r"] == 7
        sleeper = client.submit(module_program(SLEEPER, "f"))
        with pytest.raises(TimeoutError, match="did not finish within 0 s"):
            sleeper.result(timeout=0)
        sleeper.cancel()


def test_a_finished_async_jobs_result_with_no_time_to_wait_is_its_result(kcoral_server) -> None:
    async def run() -> int:
        async with kcoral.AsyncClient(kcoral_server.url) as client:
            job = await client.submit(module_program(QUICK, "f"))
            await job.wait()
            again = client.job(job.id)
            value = (await again.result(timeout=0))["r"]
            sleeper = await client.submit(module_program(SLEEPER, "f"))
            with pytest.raises(TimeoutError, match="did not finish within 0 s"):
                await sleeper.result(timeout=0)
            await sleeper.cancel()
            return value

    assert asyncio.run(run()) == 7
