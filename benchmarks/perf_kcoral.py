"""KCoral measurements of ``perf.py``: private servers and the timed client workloads.

Every server is a real ``kcoral server --device cpu --port 0`` subprocess on loopback with
its own disk cache directory; every round trip goes through the public ``kcoral.Client``
(or ``kcoral.AsyncClient`` for the concurrency row).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

import kcoral

TRIVIAL_SOURCE = "def answer(x):\n    return x + 1\n"
ECHO_SOURCE = "def echo(value):\n    return value\n"
LENGTH_SOURCE = "def length(value):\n    return len(value)\n"
SLEEP_SOURCE = "import time\ndef nap(value):\n    time.sleep(0.3)\n    return value.shape[0]\n"


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_dir: Path | None

    @property
    def pid(self) -> int:
        return self.process.pid


@contextmanager
def kcoral_server(
    extra: Sequence[str], *, log_dir: Path | None = None, profile_to: Path | None = None
) -> Iterator[Server]:
    """Start ``kcoral server`` on a free loopback port; stop it (SIGTERM) afterwards.

    ``profile_to`` runs the front-end under cProfile, writing the stats there at exit.
    """
    with tempfile.TemporaryDirectory(prefix="kcoral-perf-") as base:
        ready = Path(base) / "ready"
        prefix = [sys.executable]
        if profile_to is not None:
            prefix += ["-m", "cProfile", "-o", str(profile_to)]
        command = [
            *prefix, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
            "--ready-file", str(ready), "--sandbox", "none",
            "--log-dir", str(log_dir) if log_dir is not None else "", "--no-log-console",
            "--disk-cache-dir", os.path.join(base, "disk"), *extra,
        ]  # fmt: skip
        stderr_path = Path(base) / "stderr"
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            while not (ready.exists() and ready.read_text().strip()):
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = stderr_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"kcoral server did not start:\n{tail}")
                time.sleep(0.02)
            yield Server(ready.read_text().strip(), process, log_dir)
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- programs --------------------------------------------------------------------------


def trivial_program() -> kcoral.Program:
    """Upload a module, get its function, run it, return an int."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=TRIVIAL_SOURCE)
    function = program.get_function(module=module, name="answer")
    output = program.run(fn=function, args=[41])
    program.return_(key="answer", value=output)
    return program


def echo_program(kind: str, value: object, source: str = ECHO_SOURCE) -> kcoral.Program:
    program = kcoral.Program()
    data = program.upload(kind=kind, value=value)
    module = program.upload(kind="module", source=source)
    function = program.get_function(module=module, name=source.split("def ", 1)[1].split("(")[0])
    output = program.run(fn=function, args=[data])
    program.return_(key="value", value=output)
    return program


def trivial_request_bytes() -> int:
    """Size of the trivial program's first ``/execute`` body (what the echo should carry)."""
    from kcoral.negotiation import ExecuteNegotiation

    return ExecuteNegotiation(trivial_program()).first_attempt().length


# -- measurements ----------------------------------------------------------------------


def _check_trivial(result: kcoral.ProgramResult) -> None:
    if not result.completed or result["answer"] != 42:
        raise RuntimeError(f"trivial program failed: {result.status} {result.error}")


def trivial_round_trips(
    client: kcoral.Client, samples: int, *, spacing: float = 0.0
) -> list[float]:
    """Seconds per trivial program, built inside the timed span; optional pause between."""
    times = []
    for _ in range(samples):
        if spacing:
            time.sleep(spacing)
        start = time.perf_counter()
        result = client.execute(trivial_program())
        times.append(time.perf_counter() - start)
        _check_trivial(result)
    return times


def back_to_back_rate(client: kcoral.Client, requests: int) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        _check_trivial(client.execute(trivial_program()))
    return requests / (time.perf_counter() - start)


def warm_up_workers(url: str, workers: int) -> None:
    """Occupy every worker at once with a small tensor, so each imports torch and numpy."""

    def one() -> None:
        with kcoral.Client(url) as client:
            value = np.zeros(4, dtype=np.float32)
            result = client.execute(echo_program("tensor", value, SLEEP_SOURCE))
            if not result.completed:
                raise RuntimeError(f"warm-up failed: {result.error}")

    threads = [threading.Thread(target=one) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def bytes_cold(client: kcoral.Client, size: int, samples: int) -> list[float]:
    """64 MiB-style upload + return of fresh bytes; the program is built in the timed span."""
    data = bytearray(os.urandom(1 << 16) * (size >> 16)) if size >= 1 << 16 else bytearray(size)
    times = []
    for i in range(samples):
        data[:8] = (time.time_ns() + i).to_bytes(8, "little")  # new content: a cache miss
        start = time.perf_counter()
        result = client.execute(echo_program("bytes", data))
        times.append(time.perf_counter() - start)
        if not result.completed or len(result["value"]) != size or result["value"][:8] != data[:8]:
            raise RuntimeError(f"bytes round trip failed: {result.status} {result.error}")
    return times


def bytes_warm(client: kcoral.Client, size: int, samples: int) -> list[float]:
    """The same program again: the blob is cached, only the return travels."""
    data = bytearray(os.urandom(1 << 16) * (size >> 16)) if size >= 1 << 16 else bytearray(size)
    program = echo_program("bytes", data)
    client.execute(program)  # caches the blob
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        result = client.execute(program)
        times.append(time.perf_counter() - start)
        if not result.completed or len(result["value"]) != size:
            raise RuntimeError(f"warm bytes round trip failed: {result.status} {result.error}")
    return times


def tensor_cold(client: kcoral.Client, size: int, samples: int) -> list[float]:
    """float32 tensor upload + return (CPU mode), fresh content each time."""
    array = np.random.default_rng(0).random(size // 4, dtype=np.float32)
    times = []
    for i in range(samples):
        array[0] = float(time.time_ns() % 1_000_000 + i)
        start = time.perf_counter()
        result = client.execute(echo_program("tensor", array))
        times.append(time.perf_counter() - start)
        if not result.completed or result["value"].nbytes != size or result["value"][0] != array[0]:
            raise RuntimeError(f"tensor round trip failed: {result.status} {result.error}")
    return times


def concurrent_rates(url: str, levels: Sequence[int], requests_per_client: int) -> tuple[str, dict]:
    """Requests/s for each number of concurrent clients in one asyncio process.

    Uses ``kcoral.AsyncClient`` when it works, else one thread with its own ``Client`` per
    concurrent client; the first value says which.
    """
    try:
        rates = asyncio.run(_async_rates(url, levels, requests_per_client))
        return "AsyncClient (one asyncio loop)", rates
    except Exception as exc:
        print(f"  AsyncClient unusable ({exc!r}); using threads", file=sys.stderr)
    return "threads, one Client each", _thread_rates(url, levels, requests_per_client)


async def _async_rates(url: str, levels: Sequence[int], per_client: int) -> dict[int, float]:
    client = kcoral.AsyncClient(url)
    try:

        async def worker(count: int) -> None:
            for _ in range(count):
                _check_trivial(await client.execute(trivial_program()))

        await asyncio.gather(*(worker(2) for _ in range(max(levels))))  # open connections
        rates = {}
        for level in levels:
            start = time.perf_counter()
            await asyncio.gather(*(worker(per_client) for _ in range(level)))
            rates[level] = level * per_client / (time.perf_counter() - start)
        return rates
    finally:
        await client.aclose()


def _thread_rates(url: str, levels: Sequence[int], per_client: int) -> dict[int, float]:
    rates = {}
    for level in levels:
        clients = [kcoral.Client(url) for _ in range(level)]
        for client in clients:
            _check_trivial(client.execute(trivial_program()))
        threads = [
            threading.Thread(target=back_to_back_rate, args=(client, per_client))
            for client in clients
        ]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        rates[level] = level * per_client / (time.perf_counter() - start)
        for client in clients:
            client.close()
    return rates


def frontend_cpu_per_request(client: kcoral.Client, pid: int, requests: int) -> tuple[float, float]:
    """(front-end CPU seconds, wall seconds) per sequential trivial request."""
    process = psutil.Process(pid)
    before = process.cpu_times()
    start = time.perf_counter()
    for _ in range(requests):
        _check_trivial(client.execute(trivial_program()))
    wall = time.perf_counter() - start
    after = process.cpu_times()
    cpu = (after.user - before.user) + (after.system - before.system)
    return cpu / requests, wall / requests


def peak_rss_while_moving(url: str, pid: int, size: int) -> dict[str, float]:
    """Sample the front-end's RSS while one ``size``-byte request moves (cold blob)."""
    process = psutil.Process(pid)
    data = bytearray(os.urandom(1 << 16) * (size >> 16)) if size >= 1 << 16 else bytearray(size)
    program = echo_program("bytes", data, LENGTH_SOURCE)
    baseline = process.memory_info().rss
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, process.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    with kcoral.Client(url) as client:
        sampler.start()
        try:
            result = client.execute(program)
        finally:
            done.set()
            sampler.join()
    if not result.completed or result["value"] != size:
        raise RuntimeError(f"large request failed: {result.status} {result.error}")
    high_water = _vm_hwm(pid)
    return {"baseline_rss": baseline, "peak_rss_sampled": peak, "vm_hwm": high_water or peak}


def _vm_hwm(pid: int) -> float | None:
    """The kernel's own peak-RSS counter (Linux), which no sampling interval can miss."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def p90(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
