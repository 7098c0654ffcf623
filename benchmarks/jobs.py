"""Jobs benchmark (issue 5): live-output latency and the cost of a job over ``/execute``.

    python benchmarks/jobs.py [--prints N] [--rounds N] [--url URL]

Starts its own CPU server on loopback (2 reused workers, no sandbox, no log files) unless
``--url`` is given, then measures

* print-to-client latency: a running program prints ``time.time()`` every 50 ms; for each
  line, the delay until ``Job.events()`` yields it (same machine, same clock); p50 and p95.
  Target: p50 <= 50 ms.
* job overhead: a trivial program run with ``execute`` and with ``submit(...).result()``,
  alternating, same run; the ratio of medians. Target <= 1.5.

Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kcoral

PRINTER = """
import time
def printer(count, interval):
    for _ in range(count):
        print(f"T {time.time():.6f}", flush=True)
        time.sleep(interval)
"""
TRIVIAL = "def f():\n    return 1\n"


def start_server(directory: Path) -> tuple[subprocess.Popen, str]:
    ready = directory / "ready"
    command = [
        sys.executable, "-m", "kcoral", "server", "--port", "0", "--ready-file", str(ready),
        "--device", "cpu", "--sandbox", "none", "--num-workers", "2",
        "--max-requests-per-worker", "0", "--log-dir", "",
        "--disk-cache-dir", str(directory / "disk"),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while not (ready.exists() and ready.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    return process, ready.read_text().strip()


def program(source: str, name: str, *args: object) -> kcoral.Program:
    built = kcoral.Program()
    module = built.upload(kind="module", source=source, id="m")
    function = built.get_function(module=module, name=name, id="fn")
    value = built.run(fn=function, args=list(args), id="r")
    built.return_(key="r", value=value)
    return built


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def print_latency(client: kcoral.Client, prints: int) -> list[float]:
    """Milliseconds from each ``print`` to ``events()`` yielding it."""
    latencies: list[float] = []
    job = client.submit(program(PRINTER, "printer", prints, 0.05))
    for event in job.events():
        if event.kind != "stdout":
            continue
        now = time.time()
        for line in event.text.splitlines():
            if line.startswith("T "):
                latencies.append((now - float(line[2:])) * 1000.0)
    return latencies


def overhead(client: kcoral.Client, rounds: int) -> tuple[list[float], list[float]]:
    trivial = program(TRIVIAL, "f")
    for _ in range(5):  # warm both paths (module cache, connections)
        client.execute(trivial)
        client.submit(trivial).result()
    direct: list[float] = []
    jobs: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        client.execute(trivial)
        direct.append((time.perf_counter() - started) * 1000.0)
        started = time.perf_counter()
        client.submit(trivial).result()
        jobs.append((time.perf_counter() - started) * 1000.0)
    return direct, jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prints", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--url", default=None)
    args = parser.parse_args(argv)
    process = None
    with tempfile.TemporaryDirectory(prefix="kcoral-jobs-bench-") as directory:
        url = args.url
        if url is None:
            process, url = start_server(Path(directory))
        try:
            with kcoral.Client(url) as client:
                latencies = print_latency(client, args.prints)
                direct, jobs = overhead(client, args.rounds)
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)
    p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
    ratio = statistics.median(jobs) / statistics.median(direct)
    print(f"print -> client latency ({len(latencies)} prints): p50 {p50:.1f} ms, p95 {p95:.1f} ms")
    print(f"  target p50 <= 50 ms: {'PASS' if p50 <= 50 else 'MISS'}")
    print(
        f"trivial program ({args.rounds} rounds): execute median "
        f"{statistics.median(direct):.2f} ms, job median {statistics.median(jobs):.2f} ms, "
        f"ratio {ratio:.2f}"
    )
    print(f"  target ratio <= 1.5: {'PASS' if ratio <= 1.5 else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
