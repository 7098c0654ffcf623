"""KCoral measurements of ``perf.py``: private servers and the timed client workloads.

Every server is a real ``kcoral server --device cpu --port 0`` subprocess on loopback with
its own disk cache directory, started in one of two configurations (``DEFAULT_FLAGS``: the
server's own sandbox and limits; ``SANDBOX_NONE``: ``--sandbox none``); every round trip
goes through the public ``kcoral.Client``. The concurrency row runs N client *processes*
(``python perf_kcoral.py client URL COUNT``), each with its own ``Client``, so the clients
do not share a GIL.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import kcoral

TRIVIAL_SOURCE = "def answer(x):\n    return x + 1\n"
ECHO_SOURCE = "def echo(value):\n    return value\n"
LENGTH_SOURCE = "def length(value):\n    return len(value)\n"
SLEEP_SOURCE = "import time\ndef nap(value):\n    time.sleep(0.3)\n    return value.shape[0]\n"
# The "torch cell": what a notebook cell that makes a small tensor costs on a fresh worker.
TORCH_SOURCE = "import torch\ndef answer(x):\n    return x + int(torch.ones(1).item())\n"


@dataclass(frozen=True)
class Configuration:
    """How a server is started beyond the row's own flags (workers, reuse, cache size)."""

    name: str
    flags: tuple[str, ...]


# The server's defaults: ``--sandbox auto`` (bubblewrap where it runs) and its per-worker
# limits. Only what would measure something other than KCoral is overridden, in both
# configurations (see ``kcoral_server``).
DEFAULT_FLAGS = Configuration("default flags", ())
SANDBOX_NONE = Configuration("--sandbox none", ("--sandbox", "none"))
CONFIGURATIONS = {"default": DEFAULT_FLAGS, "sandbox-none": SANDBOX_NONE}
CONFIGURATIONS_BY_NAME = {c.name: c for c in CONFIGURATIONS.values()}


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
    extra: Sequence[str],
    *,
    configuration: Configuration = SANDBOX_NONE,
    log_dir: Path | None = None,
    profile_to: Path | None = None,
) -> Iterator[Server]:
    """Start ``kcoral server`` on a free loopback port; stop it (SIGTERM) afterwards.

    Whatever the configuration: no log files unless ``log_dir`` (the default ``logs/`` would
    write event logs and program records into the working tree and measure the disk), no
    console mirror (a stderr file nobody reads), and a private disk cache (a cache warmed
    by an earlier run, or shared with the user's ``~/.cache``, would turn cold rows warm).
    ``profile_to`` runs the front-end under cProfile, writing the stats there at exit.
    """
    with tempfile.TemporaryDirectory(prefix="kcoral-perf-") as base:
        ready = Path(base) / "ready"
        prefix = [sys.executable]
        if profile_to is not None:
            prefix += ["-m", "cProfile", "-o", str(profile_to)]
        command = [
            *prefix, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
            "--ready-file", str(ready), *configuration.flags,
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
            try:
                yield Server(ready.read_text().strip(), process, log_dir)
            except Exception as exc:
                # A failed round trip is only explained by what the server said meanwhile.
                time.sleep(0.5)
                state = "running" if process.poll() is None else f"exit {process.returncode}"
                tail = stderr_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{exc}\nkcoral server ({state}) stderr:\n{tail}") from exc
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- programs --------------------------------------------------------------------------


def trivial_program(source: str = TRIVIAL_SOURCE) -> kcoral.Program:
    """Upload a module, get its function, run it, return an int."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=source)
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


def torch_program() -> kcoral.Program:
    """The trivial program's shape, but its module imports torch and makes a small tensor."""
    return trivial_program(TORCH_SOURCE)


def trivial_request_bytes() -> int:
    """Size of the trivial program's first ``/execute`` body (what the echo should carry)."""
    from kcoral.connection.negotiation import ExecuteNegotiation

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


def alternating_round_trips(
    client: kcoral.Client, trivial: int, torch: int, *, spacing: float
) -> tuple[list[float], list[float]]:
    """(trivial, torch cell) seconds per program, spaced, each torch cell right after a
    trivial one, so both see the same load; the first ``torch`` rounds carry a torch cell."""
    trivial_times: list[float] = []
    torch_times: list[float] = []
    for i in range(max(trivial, torch)):
        if i < trivial:
            trivial_times += trivial_round_trips(client, 1, spacing=spacing)
        if i < torch:
            time.sleep(spacing)
            start = time.perf_counter()
            result = client.execute(torch_program())
            torch_times.append(time.perf_counter() - start)
            _check_trivial(result)
    return trivial_times, torch_times


def _plus_one(x: int) -> int:
    return x + 1


def timed_calls(call: Callable[[], object], samples: int, warm_up: int = 3) -> list[float]:
    """Seconds per ``call()`` after ``warm_up`` untimed ones; ``call`` checks its own answer."""
    for _ in range(warm_up):
        call()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def remote_function_round_trips(client: kcoral.Client, samples: int) -> dict[str, list[float]]:
    """Seconds per trivial remote function call (``client.function``), JSON and pickle
    arguments, after a warm-up (cloudpickle's first import on the worker)."""
    calls = {
        "json": client.function()(_plus_one),
        "pickle": client.function(serialization="pickle")(_plus_one),
    }

    def checked(name: str, function: Any) -> Callable[[], None]:
        def call() -> None:
            answer = function.remote(1)
            if answer != 2:
                raise RuntimeError(f"remote function ({name}) answered {answer!r}")

        return call

    return {name: timed_calls(checked(name, fn), samples) for name, fn in calls.items()}


def session_round_trips(client: kcoral.Client, samples: int) -> list[float]:
    """Seconds per trivial program in a session (EXTENSIONS §11): its pinned worker, the
    lease still taken per program."""
    with client.session() as session:
        return timed_calls(lambda: _check_trivial(session.execute(trivial_program())), samples)


def back_to_back(client: kcoral.Client, requests: int) -> dict[str, float]:
    """Trivial programs one right after the other: the rate, the p50 round trip and the
    median ``queue_ms`` the server reports (the wait for a seat's next fresh worker)."""
    start = time.perf_counter()
    times, queued = _back_to_back_samples(client, requests)
    return {
        "per_second": requests / (time.perf_counter() - start),
        "p50_seconds": median(times),
        "queue_ms_median": median(queued),
    }


def _back_to_back_samples(client: kcoral.Client, requests: int) -> tuple[list[float], list[float]]:
    """(seconds per trivial program, ``queue_ms`` of each), one right after the other."""
    times: list[float] = []
    queued: list[float] = []
    for _ in range(requests):
        sent = time.perf_counter()
        result = client.execute(trivial_program())
        times.append(time.perf_counter() - sent)
        _check_trivial(result)
        queued.append(result.queue_ms)
    return times, queued


#: After an idle moment this machine takes ~75 trivial round trips (~0.1 s of them) to reach
#: its steady speed: after a 0.25 s pause, 5 series of 400 reused trips ran their first 25
#: at 1.85-1.97 ms, the next 25 at 1.50-1.54, the next at 1.25-1.28, then 1.21-1.24 ms
#: (README round 15; the host's idle and power states, not the server). A timed series that
#: follows a pause therefore starts after this long of untimed programs, as Ray's calls do
#: (``perf_ray.py``); the spaced rows are the ones meant to measure the pause.
MACHINE_WARM_SECONDS = 0.15


def untimed_until_warm(
    run_one: Callable[[], object],
    programs: int,
    seconds: float = MACHINE_WARM_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Call ``run_one`` until it ran ``programs`` times and ``seconds`` passed (whichever
    is later); returns how many times it ran."""
    start = clock()
    done = 0
    while done < programs or clock() - start < seconds:
        run_one()
        done += 1
    return done


def warm_machine(client: kcoral.Client, seconds: float = MACHINE_WARM_SECONDS) -> int:
    """Untimed trivial round trips on ``client`` for ``seconds`` (``untimed_until_warm``)."""
    return untimed_until_warm(lambda: trivial_round_trips(client, 1), 1, seconds)


def back_to_back_beside_reused(
    fresh: kcoral.Client,
    reused: kcoral.Client,
    requests: int,
    *,
    blocks: int = 3,
    settle: int = 2,
    quiet: float = 0.25,
    warm: float = MACHINE_WARM_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """``back_to_back`` on ``fresh`` in ``blocks`` blocks, each right after as many trivial
    round trips on ``reused`` (a second server): the two p50s then come from the same
    phases of the machine, so their ratio compares like with like. Measured apart, the
    reused trip of the same code moved between 1.6 and 2.5 ms from run to run while the
    back-to-back p50 did not, and the verdict followed that noise (README round 13).

    Each block starts ``quiet`` seconds after the other server's, so that server's work
    after its last program (a fresh worker's teardown and its successor's start; a reused
    worker's clean-up) does not slow this block's first trips, and then runs programs it
    does not time (``settle`` of them and for ``warm`` seconds, ``untimed_until_warm``), so
    back to back is measured once it is back to back and both sides once the machine is
    back to its steady speed: measured right after the pause, the reused trips were ~50%
    slower and the fresh ones ~10% (README round 15), which flattered the ratio."""
    times: list[float] = []
    queued: list[float] = []
    reused_times: list[float] = []
    busy = 0.0
    blocks = max(1, min(blocks, requests))
    for block in range(blocks):
        count = requests // blocks + (1 if block < requests % blocks else 0)
        time.sleep(quiet)
        untimed_until_warm(lambda: trivial_round_trips(reused, 1), settle, warm, clock)
        reused_times += trivial_round_trips(reused, count)
        time.sleep(quiet)
        untimed_until_warm(lambda: _back_to_back_samples(fresh, 1), settle, warm, clock)
        start = time.perf_counter()
        block_times, block_queued = _back_to_back_samples(fresh, count)
        busy += time.perf_counter() - start
        times += block_times
        queued += block_queued
    return {
        "per_second": len(times) / busy if busy else 0.0,
        "p50_seconds": median(times),
        "queue_ms_median": median(queued),
        "reused_p50_seconds": median(reused_times),
    }


def warm_up_workers(url: str, workers: int) -> None:
    """Occupy every worker at once with a small tensor, so each imports torch and numpy."""

    failures: list[str] = []

    def one() -> None:
        with kcoral.Client(url) as client:
            value = np.zeros(4, dtype=np.float32)
            result = client.execute(echo_program("tensor", value, SLEEP_SOURCE))
            if not result.completed:
                failures.append(f"{result.status} {result.error}")

    threads = [threading.Thread(target=one) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:  # a cold worker would make every later row measure its imports
        raise RuntimeError(f"warm-up failed: {failures[0]}")


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


def concurrent_process_rates(url: str, levels: Sequence[int], requests_per_client: int) -> dict:
    """Requests/s for each number of concurrent client processes, one ``Client`` each.

    Per level: start the processes, let each open its connection and run two trivial
    requests, then release them all at once (a line on stdin); rate = all their requests /
    the wall time from that signal until the last one is done.
    """
    return {level: _process_rate(url, level, requests_per_client) for level in levels}


def _process_rate(url: str, clients: int, requests_per_client: int) -> float:
    command = [sys.executable, __file__, "client", url, str(requests_per_client)]
    processes = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(clients)
    ]
    try:
        for process in processes:
            _expect_line(process, "ready")
        start = time.perf_counter()
        for process in processes:
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in processes:
            _expect_line(process, "done")
        wall = time.perf_counter() - start
    finally:
        for process in processes:
            process.stdin.close()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
    return clients * requests_per_client / wall


def _expect_line(process: subprocess.Popen, expected: str) -> None:
    line = process.stdout.readline().strip()
    if line != expected:
        raise RuntimeError(f"a client process said {line!r} instead of {expected!r}")


def _client_process(url: str, requests: int) -> None:
    """One concurrent client (``python perf_kcoral.py client URL COUNT``)."""
    with kcoral.Client(url) as client:
        for _ in range(2):  # connection open, every lazy import done
            _check_trivial(client.execute(trivial_program()))
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        for _ in range(requests):
            _check_trivial(client.execute(trivial_program()))
    print("done", flush=True)


@dataclass(frozen=True)
class CpuPerRequest:
    """Seconds per sequential trivial request: front-end CPU, worker CPU and wall time."""

    frontend: float
    workers: float
    wall: float


def cpu_per_request(client: kcoral.Client, pid: int, requests: int) -> CpuPerRequest:
    """Front-end and worker CPU (user + system) per sequential trivial request.

    The front-end is the ``kcoral server`` process itself; the workers are the processes
    below it that have no children of their own (under bubblewrap: ``bwrap`` -> per-seat
    launcher -> forked worker; unsandboxed: launcher -> worker), found with psutil. The
    launchers are left out on purpose: they fork nothing while reused workers serve, but
    each imports torch once it has been idle for a moment (``--worker-preload``), and that
    one-off second of CPU is not a cost of any request.
    """
    frontend = psutil.Process(pid)
    before, workers_before = frontend.cpu_times(), worker_cpu_seconds(pid)
    start = time.perf_counter()
    for _ in range(requests):
        _check_trivial(client.execute(trivial_program()))
    wall = time.perf_counter() - start
    after, workers_after = frontend.cpu_times(), worker_cpu_seconds(pid)
    cpu = (after.user - before.user) + (after.system - before.system)
    worker_cpu = sum(
        seconds - workers_before[key]
        for key, seconds in workers_after.items()
        if key in workers_before  # a worker started meanwhile is not a reused one
    )
    return CpuPerRequest(cpu / requests, worker_cpu / requests, wall / requests)


def wait_until_quiet(
    pid: int, *, below: float = 0.05, window: float = 0.25, timeout: float = 30.0
) -> float:
    """Wait until the server ``pid`` and every process below it use less than ``below`` of
    one core over ``window`` seconds; the seconds waited (after ``timeout`` it measures
    anyway). Its fork servers import torch once they have been idle a moment
    (``--worker-preload``, ~1-2 s of CPU each, two under bubblewrap): without the wait that
    lands in whichever rows are measured first."""
    start = time.perf_counter()
    before = _tree_cpu_seconds(pid)
    while time.perf_counter() - start < timeout:
        time.sleep(window)
        after = _tree_cpu_seconds(pid)
        if after - before < below * window:
            break
        before = after
    return time.perf_counter() - start


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds so far of ``pid`` and the processes below it (their own, not reaped
    children's: a worker that ends meanwhile would add its whole life at once)."""
    root = psutil.Process(pid)
    return cpu_seconds([root, *root.children(recursive=True)])


def cpu_seconds(processes: Iterable[psutil.Process]) -> float:
    """User + system CPU seconds so far of ``processes`` (their own; one gone is skipped)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def worker_cpu_seconds(pid: int) -> dict[tuple[int, float], float]:
    """CPU seconds so far of each childless process below ``pid`` (the workers), keyed by
    (pid, create time) so a reused pid is a new process; one that exits meanwhile is skipped."""
    seconds = {}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.children():
                continue
            times = child.cpu_times()
            key = (child.pid, child.create_time())
        except psutil.Error:
            continue
        seconds[key] = times.user + times.system + times.children_user + times.children_system
    return seconds


def resolved_sandbox(url: str) -> str:
    """What confines programs on that server (``/v1/info``: ``bubblewrap`` or ``none``)."""
    with urllib.request.urlopen(url + "/v1/info", timeout=30) as response:
        return str(json.load(response).get("sandbox"))


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


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "client":
        _client_process(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: perf_kcoral.py client URL REQUESTS")
