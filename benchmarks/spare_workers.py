"""Fresh worker per program, with each seat's spare worker (the default) and without it.

    python benchmarks/spare_workers.py [--spaced N] [--back-to-back N]

Starts one server per configuration (default flags, one seat: ``--num-workers 1``), warms
it, then measures trivial programs spaced 100 ms and back to back: the client's p50, the
server's median ``elapsed_ms`` and ``queue_ms``, and the back-to-back rate. Prints each
configuration and the ratio spares / ``--no-spare-workers`` (issue 31). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_kcoral as kc

import kcoral

CONFIGURATIONS = {"spares (default)": [], "--no-spare-workers": ["--no-spare-workers"]}


def measure(extra: list[str], spaced: int, back: int) -> dict[str, float]:
    args = ["--num-workers", "1", *extra]
    with (
        kc.kcoral_server(args, configuration=kc.DEFAULT_FLAGS) as server,
        kcoral.Client(server.url) as client,
    ):
        for _ in range(3):
            client.execute(kc.trivial_program())
            time.sleep(0.3)
        totals, elapsed = [], []
        for _ in range(spaced):
            time.sleep(0.1)
            start = time.perf_counter()
            result = client.execute(kc.trivial_program())
            totals.append(time.perf_counter() - start)
            elapsed.append(result.elapsed_ms)
        rows = kc.back_to_back(client, back)
    return {
        "spaced p50 (ms)": statistics.median(totals) * 1000,
        "spaced elapsed_ms": statistics.median(elapsed),
        "back to back p50 (ms)": rows["p50_seconds"] * 1000,
        "back to back queue_ms": rows["queue_ms_median"],
        "back to back req/s": rows["per_second"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spaced", type=int, default=40)
    parser.add_argument("--back-to-back", type=int, default=60)
    args = parser.parse_args(argv)
    results = {
        name: measure(extra, args.spaced, args.back_to_back)
        for name, extra in CONFIGURATIONS.items()
    }
    names = list(results)
    print(f"| measure | {names[0]} | {names[1]} | ratio |")
    print("|---|---|---|---|")
    for key in results[names[0]]:
        ours, theirs = results[names[0]][key], results[names[1]][key]
        ratio = ours / theirs if theirs else float("inf")
        print(f"| {key} | {ours:.2f} | {theirs:.2f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
