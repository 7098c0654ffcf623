"""Round trip of a trivial remote function call, JSON and pickle mode, against a plain program.

    python benchmarks/remote_functions.py [--url URL] [--calls N]

Without ``--url`` a private CPU server is started (and stopped) for the run. Prints the
median round trip of each kind and its ratio to a trivial ``/execute`` program measured in
the same run (module upload + get_function + run + return of a constant).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import kcoral


def trivial(x):
    return x + 1


def baseline_program() -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source="def trivial(x):\n    return x + 1\n")
    function = program.get_function(module=module, name="trivial")
    output = program.run(fn=function, args=[1])
    program.return_(key="output", value=output)
    return program


def median_ms(call: Callable[[], object], calls: int) -> float:
    for _ in range(3):  # warm workers, caches and imports (cloudpickle on the worker)
        call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


@contextmanager
def private_server() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as base:
        ready = Path(base) / "ready"
        command = [
            sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
            "--ready-file", str(ready), "--sandbox", "none", "--log-dir", "",
            "--disk-cache-dir", os.path.join(base, "disk"), "--max-requests-per-worker", "0",
            "--num-workers", "1",
        ]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 90
            while not (ready.exists() and ready.read_text().strip()):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the benchmark server did not start")
                time.sleep(0.05)
            yield ready.read_text().strip()
        finally:
            process.terminate()
            process.wait(timeout=30)


def run(url: str, calls: int) -> None:
    with kcoral.Client(url) as client:
        program = baseline_program()
        json_fn = client.function()(trivial)
        pickle_fn = client.function(serialization="pickle")(trivial)
        results = {
            "execute (baseline)": median_ms(lambda: client.execute(program), calls),
            "remote json": median_ms(lambda: json_fn.remote(1), calls),
            "remote pickle": median_ms(lambda: pickle_fn.remote(1), calls),
        }
    baseline = results["execute (baseline)"]
    print(f"{'call':<20} {'median ms':>10} {'ratio':>7}   ({calls} calls each)")
    for name, value in results.items():
        print(f"{name:<20} {value:>10.2f} {value / baseline:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an existing server; default: start a private CPU one")
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    if args.url:
        run(args.url, args.calls)
    else:
        with private_server() as url:
            run(url, args.calls)


if __name__ == "__main__":
    main()
