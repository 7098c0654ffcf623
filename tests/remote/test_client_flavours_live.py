"""Each flavour's shell against a real server: the same calls through ``Client`` and
``AsyncClient`` give the same answers (request ids and timings aside)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from remote_samples import factorial

from kcoral import AsyncClient, Client, Program
from kcoral.errors import KCoralError


def summary(value: Any) -> Any:
    """What must agree between the flavours: no ids, no timings."""
    if hasattr(value, "results") and hasattr(value, "status"):
        return (value.status, dict(value.results), value.stdout, value.error is None)
    if isinstance(value, dict) and "status" in value and "job_id" in value:
        return value["status"]
    return value


def blob_program(data: bytes) -> Program:
    program = Program()
    module = program.upload(
        kind="module", source="def size(b):\n    print('got', len(b))\n    return len(b)\n"
    )
    function = program.get_function(module=module, name="size")
    blob = program.upload(kind="bytes", value=data)
    program.return_(key="size", value=program.run(fn=function, args=[blob]))
    return program


def submit_and_wait(client: Any) -> Any:
    job = client.submit(blob_program(b"job"), serialization="json")
    texts = [event.text for event in job.events() if event.kind == "stdout"]
    return "".join(texts), job.result()


async def submit_and_wait_async(client: AsyncClient) -> Any:
    job = await client.submit(blob_program(b"job"), serialization="json")
    texts = [event.text async for event in job.events() if event.kind == "stdout"]
    return "".join(texts), await job.result()


def refused(client: Any) -> Any:
    program = Program()
    program.upload(kind="module", source="x = 1\n", id="m")
    program.upload(kind="module", source="x = 2\n", id="n")
    return client.execute(program, timeout_seconds=-1)


SCENARIOS: dict[str, tuple[Callable[[Client], Any], Callable[[AsyncClient], Any]]] = {
    "health": (lambda c: c.health()["status"], lambda c: c.health()),
    "features": (lambda c: c.info()["features"], lambda c: c.info()),
    "a blob program twice": (
        lambda c: [c.execute(blob_program(b"x" * 1000)) for _ in range(2)],
        lambda c: asyncio.gather(*[c.execute(blob_program(b"x" * 1000)) for _ in range(2)]),
    ),
    "a refused request": (refused, refused),
    "a job with live output": (submit_and_wait, submit_and_wait_async),
    "remote function, json": (
        lambda c: c.function()(factorial).remote(5),
        lambda c: c.function()(factorial).remote(5, run_async=True),
    ),
    "remote function, pickle": (
        lambda c: c.function(serialization="pickle")(factorial).remote(5),
        lambda c: c.function(serialization="pickle")(factorial).remote(5, run_async=True),
    ),
}


def outcome(call: Callable[[], Any]) -> Any:
    try:
        value = call()
    except KCoralError as exc:
        return ("raised", exc.status_code, exc.kind)
    if isinstance(value, list):
        return [summary(v) for v in value]
    if isinstance(value, tuple):
        return tuple(summary(v) for v in value)
    return summary(value)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_sync_and_async_clients_agree_against_a_real_server(server_url: str, name: str) -> None:
    sync_call, async_call = SCENARIOS[name]
    with Client(server_url) as client:
        sync_outcome = outcome(lambda: sync_call(client))

    async def run() -> Any:
        async with AsyncClient(server_url) as client:
            value = await async_call(client)
        return value

    async_outcome = outcome(lambda: asyncio.run(run()))
    if name == "health":
        async_outcome = async_outcome["status"]
    if name == "features":
        async_outcome = async_outcome["features"]
    assert sync_outcome == async_outcome
    assert sync_outcome  # something was compared


def test_an_async_call_that_times_out_cancels_its_program_on_the_server(server_url: str) -> None:
    # Before, asyncio.wait_for's timeout left the program running to its end (two minutes
    # here), holding a worker (on a GPU server, its GPU) for a caller that had given up.
    program = Program()
    module = program.upload(kind="module", source="import time\ndef nap():\n    time.sleep(120)\n")
    program.run(fn=program.get_function(module=module, name="nap"), args=[])

    async def scenario() -> None:
        async with AsyncClient(server_url) as client:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.execute(program, timeout_seconds=300), 3)
            for _ in range(300):
                load = (await client.health())["load"]
                if load["requests_in_progress"] == 0:
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"the program still runs on the server: {load}")

    asyncio.run(scenario())


def nap() -> None:
    import time

    time.sleep(120)


def test_a_cancelled_run_async_call_of_a_sync_client_cancels_its_program_on_the_server(
    server_url: str,
) -> None:
    # Before, the sync Client's blocking call ran on an executor thread that a cancel left
    # alone: the program ran on to its end (two minutes here) for a caller that had given up.
    with Client(server_url) as client:
        remote_nap = client.function(timeout=300)(nap)

        def in_progress() -> int:
            return int(client.health()["load"]["requests_in_progress"])

        async def scenario() -> None:
            call = asyncio.ensure_future(remote_nap.remote(run_async=True))
            while in_progress() == 0:  # the program has started on the server
                assert not call.done(), call
                await asyncio.sleep(0.05)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

        asyncio.run(scenario())
        for _ in range(300):
            if in_progress() == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"the program still runs on the server: {client.health()['load']}")


KERNEL_LIKE_SCRIPT = """
import asyncio, sys
import kcoral

client = kcoral.AsyncClient(sys.argv[1])


def nap():
    import time

    time.sleep(120)


remote_nap = client.function(timeout=300)(nap)


async def kernel():  # a notebook kernel: a thread whose loop runs, and lives on after a cell
    try:
        remote_nap.remote()  # the blocking form, as in a cell
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()


# not asyncio.run: its SIGINT handler cancels the main task (a kernel raises KeyboardInterrupt)
asyncio.new_event_loop().run_until_complete(kernel())
"""


def test_an_interrupted_blocking_call_of_an_async_client_function_in_a_running_loop_is_cancelled(
    server_url: str, tmp_path: Path
) -> None:
    # Before, the call ran on a helper thread's loop that the interrupt left alone: the
    # cell (here the script) went on and the program ran to its end on the server.
    script = tmp_path / "kernel_like.py"
    script.write_text(KERNEL_LIKE_SCRIPT)
    with Client(server_url) as client:

        def in_progress() -> int:
            return int(client.health()["load"]["requests_in_progress"])

        kernel = subprocess.Popen(
            [sys.executable, str(script), server_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            while in_progress() == 0:  # the program has started on the server
                assert kernel.poll() is None
                time.sleep(0.05)
            kernel.send_signal(signal.SIGINT)
            assert kernel.stdout is not None and kernel.stdout.readline() == "interrupted\n"
            for _ in range(300):
                if in_progress() == 0:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"the program still runs: {client.health()['load']}")
        finally:
            kernel.communicate("\n", timeout=60)
