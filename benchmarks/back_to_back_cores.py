"""A fresh worker back to back against a reused trip, on 1, 2, ... of this machine's CPUs.

    python benchmarks/back_to_back_cores.py [--cpus 1,2] [--requests 240]
                                            [--configuration default|sandbox-none] [--json F]

Issue 31's target (a trivial program back to back, each on a fresh worker, at most 4× a
trivial round trip on a reused worker) misses on the 2-core VM, where the fresh trip is
bound by CPU: ~13 ms of CPU per program (the fork, the spare's start, its copy-on-write
faults and its exit, on top of the reused trip's ~2.6 ms) in ~8 ms of wall. This measures
that ratio with the whole benchmark (this client, both servers, their fork servers and
workers, which inherit this process's CPU affinity) confined to the first k CPUs, for each
k asked, so a machine with more cores (the GPU machine's 16) shows what the core count does
to it. Same programs, servers and pairing as ``perf.py``'s row
(``perf_kcoral.back_to_back_beside_reused``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_kcoral as kc

import kcoral

#: issue 31: a fresh worker's trivial program back to back, as a multiple of a reused trip
TARGET_RATIO = 4.0
#: perf.py's two servers: two reused workers; the defaults (one seat, a fresh worker per
#: program, its spare started ahead). Their seats do not follow the CPUs allowed.
REUSED_ARGS = ("--num-workers", "2", "--max-requests-per-worker", "0")
FRESH_ARGS: tuple[str, ...] = ()


def measure(cpus: list[int], configuration: kc.Configuration, requests: int) -> dict:
    """One row: everything from here down runs on ``cpus`` only."""
    os.sched_setaffinity(0, cpus)
    with (
        kc.kcoral_server(REUSED_ARGS, configuration=configuration) as reused_server,
        kcoral.Client(reused_server.url) as reused,
        kc.kcoral_server(FRESH_ARGS, configuration=configuration) as fresh_server,
        kcoral.Client(fresh_server.url) as fresh,
    ):
        kc.warm_up_workers(reused_server.url, 2)
        kc.trivial_round_trips(reused, 50)
        kc.trivial_round_trips(fresh, 4)
        kc.wait_until_quiet(reused_server.pid)
        kc.wait_until_quiet(fresh_server.pid)
        row = kc.back_to_back_beside_reused(fresh, reused, requests)
    ratio = row["p50_seconds"] / row["reused_p50_seconds"]
    return {
        "cpus": len(cpus),
        "reused_p50_ms": row["reused_p50_seconds"] * 1000,
        "back_to_back_p50_ms": row["p50_seconds"] * 1000,
        "ratio": ratio,
        "verdict": "PASS" if ratio <= TARGET_RATIO else "MISS",
        "queue_ms_median": row["queue_ms_median"],
        "load_average_after": os.getloadavg()[0],
    }


def cpu_counts(text: str) -> list[int]:
    """``--cpus``: comma-separated positive CPU counts."""
    try:
        counts = [int(count) for count in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated numbers: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"CPU counts start at 1: {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpus", type=cpu_counts, default=[1, 2], help="comma-separated CPU counts to measure"
    )
    parser.add_argument("--requests", type=int, default=240, help="back-to-back programs")
    parser.add_argument("--configuration", choices=sorted(kc.CONFIGURATIONS), default="default")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    # ``timeout`` (the device script) ends a long run with SIGTERM: exit through the
    # servers' context managers, which stop them, instead of leaving them running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    allowed = sorted(os.sched_getaffinity(0))
    counts: list[int] = args.cpus
    if max(counts) > len(allowed):
        parser.error(f"--cpus: this process may use {len(allowed)} CPUs")
    configuration = kc.CONFIGURATIONS[args.configuration]
    rows = []
    print(f"{configuration.name}, {args.requests} programs back to back; target ≤ {TARGET_RATIO}×")
    print("| CPUs | reused p50 | back to back p50 | ratio | verdict | queue_ms | load |")
    print("|---|---|---|---|---|---|---|")
    try:
        for count in counts:
            row = measure(allowed[:count], configuration, args.requests)
            rows.append(row)
            print(
                f"| {row['cpus']} | {row['reused_p50_ms']:.2f} ms "
                f"| {row['back_to_back_p50_ms']:.2f} ms | {row['ratio']:.2f}× "
                f"| {row['verdict']} | {row['queue_ms_median']:.2f} "
                f"| {row['load_average_after']:.2f} |",
                flush=True,
            )
    finally:
        os.sched_setaffinity(0, allowed)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
