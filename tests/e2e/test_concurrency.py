"""Eight concurrent clients against one server, overlap proven by the server itself."""

from __future__ import annotations

import asyncio
import threading
import uuid

import numpy as np
import pytest
from e2e_support import health

import kcoral

CLIENTS = 8

# Each program waits until all eight are inside a worker at once: it only completes if the
# server really runs them concurrently (bounded, so a regression fails instead of hanging).
RENDEZVOUS = (
    "import os, time\n"
    "def meet(folder, me, total, data):\n"
    "    open(os.path.join(folder, me), 'w').close()\n"
    "    deadline = time.monotonic() + 60\n"
    "    while len(os.listdir(folder)) < total:\n"
    "        if time.monotonic() > deadline:\n"
    "            raise TimeoutError('peers never arrived')\n"
    "        time.sleep(0.02)\n"
    "    print(me)\n"
    "    return {'me': me, 'sum': float(data.sum()), 'echo': data}\n"
)


def rendezvous_program(folder: str, me: str, data: np.ndarray) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=RENDEZVOUS, id="m")
    meet = program.get_function(module=module, name="meet", id="meet")
    tensor = program.upload(kind="tensor", value=data, id="data")
    out = program.run(fn=meet, args=[folder, me, CLIENTS, tensor], id="out")
    program.return_(key="out", value=out)
    return program


class HealthWatcher(threading.Thread):
    """Polls ``/health`` and keeps the largest ``requests_in_progress`` it saw."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.peak, self.capacity = url, 0, set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            load = health(self.url)["load"]
            self.peak = max(self.peak, load["requests_in_progress"])
            self.capacity.add(load["request_capacity"])
            self.done.wait(0.02)


def check(result: kcoral.ProgramResult, me: str, data: np.ndarray) -> None:
    assert result.completed, result.error
    assert result["out"]["me"] == me and result["out"]["sum"] == float(data.sum())
    np.testing.assert_array_equal(result["out"]["echo"], data)
    assert result.stdout == me + "\n"


@pytest.mark.slow
def test_eight_threads_with_their_own_clients_run_concurrently_and_all_get_their_answer(
    server_factory, tmp_path
):
    server = server_factory("--num-workers", str(CLIENTS))
    folder = tmp_path / "meet"
    folder.mkdir()
    inputs = {f"c{i}": np.full((16,), i, dtype=np.float32) for i in range(CLIENTS)}
    results: dict[str, object] = {}
    watcher = HealthWatcher(server.url)
    watcher.start()

    def one(me: str) -> None:
        try:
            with kcoral.Client(server.url) as c:
                results[me] = c.execute(rendezvous_program(str(folder), me, inputs[me]))
        except Exception as exc:  # reported below, with the others
            results[me] = exc

    threads = [threading.Thread(target=one, args=(me,)) for me in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    watcher.done.set()
    watcher.join(10)
    for me, data in inputs.items():
        check(results[me], me, data)
    assert len({r.request_id for r in results.values()}) == CLIENTS
    assert watcher.peak == CLIENTS
    assert watcher.capacity == {CLIENTS}


@pytest.mark.slow
def test_eight_concurrent_executions_on_one_async_client(server_factory, tmp_path):
    server = server_factory("--num-workers", str(CLIENTS))
    folder = tmp_path / "meet"
    folder.mkdir()
    tag = uuid.uuid4().hex[:6]
    inputs = {f"{tag}{i}": np.arange(i, i + 4, dtype=np.int64) for i in range(CLIENTS)}
    watcher = HealthWatcher(server.url)
    watcher.start()

    async def main() -> list[kcoral.ProgramResult]:
        async with kcoral.AsyncClient(server.url) as c:
            return await asyncio.gather(
                *(c.execute(rendezvous_program(str(folder), me, d)) for me, d in inputs.items())
            )

    try:
        results = asyncio.run(main())
    finally:
        watcher.done.set()
        watcher.join(10)
    for (me, data), result in zip(inputs.items(), results, strict=True):
        check(result, me, data)
    assert watcher.peak == CLIENTS
