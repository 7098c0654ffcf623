"""KCoral performance harness (issue 4): one command, every measure, its baseline and target.

    python benchmarks/perf.py [--quick] [--repeat N] [--json PATH] [--profile DIR]

Starts its own servers on loopback (CPU mode, no sandbox, no log files, private disk
caches), a bare Tornado echo server, and measures round trips, bulk transfers, concurrency,
front-end CPU and memory, worker start-up (spawn vs preloaded fork), and this machine's raw
loopback TCP, SHA-256 and memcpy speed. Prints a table of medians, ratios and PASS/MISS per
target plus a machine description. Timings are never asserted: MISS is information.

``--quick`` uses tiny sizes and a few iterations (a smoke test, not a measurement).
``--repeat N`` multiplies every sample count. ``--profile DIR`` adds a profile of trivial
requests (client cProfile, front-end cProfile, event-log phase timestamps) written to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_baselines as base
import perf_kcoral as kc
import perf_workers as workers

import kcoral

MIB = 1 << 20


@dataclass
class Row:
    """One line of the table; ``ratio``/``target`` empty for report-only measures."""

    measure: str
    value: str
    reference: str = ""
    ratio: float | None = None
    target: str = ""
    verdict: str = "info"


@dataclass(frozen=True)
class Plan:
    bulk_bytes: int
    rss_bytes: int
    trivial: int
    spaced: int
    back_to_back: int
    bulk: int
    per_client: int
    cpu_requests: int
    starts: int
    raw_reps: int


def make_plan(quick: bool, repeat: int) -> Plan:
    if quick:
        return Plan(MIB, 4 * MIB, 3, 2, 2, 2, 1, 3, 1, 2)
    r = max(1, repeat)
    return Plan(64 * MIB, 200 * MIB, 40 * r, 15 * r, 15 * r, 5 * r, 20 * r, 50 * r, 5 * r, 5 * r)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def judge(ratio: float, limit: float, *, at_least: bool = False) -> str:
    ok = ratio >= limit if at_least else ratio <= limit
    return "PASS" if ok else "MISS"


def measure(plan: Plan, log: Callable[[str], None]) -> tuple[list[Row], dict]:
    results: dict = {"plan": asdict(plan)}
    rows: list[Row] = []

    log("raw speeds: loopback TCP, SHA-256, memcpy, python start-up")
    tcp = base.loopback_tcp_seconds_per_byte(plan.bulk_bytes, plan.raw_reps)
    sha = base.sha256_seconds_per_byte(plan.bulk_bytes, plan.raw_reps)
    copy = base.memcpy_seconds_per_byte(plan.bulk_bytes, plan.raw_reps)
    startup = base.python_startup_seconds(max(1, plan.starts))
    results["raw"] = {
        "tcp_seconds_per_byte": tcp,
        "sha256_seconds_per_byte": sha,
        "memcpy_seconds_per_byte": copy,
        "python_startup_seconds": startup,
    }

    log("bare Tornado echo (urllib3, same transport as kcoral.Client)")
    body_size = kc.trivial_request_bytes()
    with base.echo_server() as echo_url:
        echo = kc.median(base.echo_round_trips(echo_url, body_size, plan.trivial))
    results["echo"] = {"body_bytes": body_size, "p50_seconds": echo}

    log("worker start: spawn vs preloaded fork")
    spawn = kc.median(workers.spawn_start_seconds(plan.starts))
    fork = kc.median(workers.fork_start_seconds(plan.starts))
    results["worker_start"] = {"spawn_seconds": spawn, "fork_seconds": fork}

    reused_args = ["--num-workers", "2", "--max-requests-per-worker", "0"]
    reused_args += ["--cache-capacity-bytes", str(max(1024 * MIB, 8 * plan.bulk_bytes))]
    with kc.kcoral_server(reused_args) as server, kcoral.Client(server.url) as client:
        log("warming both reused workers")
        kc.warm_up_workers(server.url, 2)
        kc.trivial_round_trips(client, 3)
        log("trivial round trips, reused workers")
        trivial = kc.trivial_round_trips(client, plan.trivial)
        log("front-end CPU per trivial request")
        cpu, wall = kc.frontend_cpu_per_request(client, server.pid, plan.cpu_requests)
        log(f"{plan.bulk_bytes // MIB} MiB bytes cold / warm, tensor cold")
        kc.bytes_cold(client, plan.bulk_bytes, 1)  # first big transfer sizes the buffers
        cold = kc.median(kc.bytes_cold(client, plan.bulk_bytes, plan.bulk))
        warm = kc.median(kc.bytes_warm(client, plan.bulk_bytes, plan.bulk))
        kc.tensor_cold(client, plan.bulk_bytes, 1)
        tensor = kc.median(kc.tensor_cold(client, plan.bulk_bytes, plan.bulk))
        log("concurrent clients 1, 2, 4, 8")
        how, rates = kc.concurrent_rates(server.url, (1, 2, 4, 8), plan.per_client)
    results["reused"] = {
        "trivial_p50_seconds": kc.median(trivial),
        "trivial_p90_seconds": kc.p90(trivial),
        "frontend_cpu_seconds_per_request": cpu,
        "wall_seconds_per_request": wall,
        "bytes_cold_seconds": cold,
        "bytes_warm_seconds": warm,
        "tensor_cold_seconds": tensor,
        "concurrency_client": how,
        "concurrency_rates": {str(k): v for k, v in rates.items()},
    }

    with kc.kcoral_server([]) as server, kcoral.Client(server.url) as client:
        log("fresh worker per request: spaced 100 ms, then back to back")
        kc.trivial_round_trips(client, 2, spacing=0.5)
        spaced = kc.trivial_round_trips(client, plan.spaced, spacing=0.1)
        rate = kc.back_to_back_rate(client, plan.back_to_back)
    results["fresh"] = {
        "spaced_p50_seconds": kc.median(spaced),
        "spaced_p90_seconds": kc.p90(spaced),
        "back_to_back_per_second": rate,
    }

    log(f"front-end peak RSS while moving {plan.rss_bytes // MIB} MiB")
    rss_args = ["--max-requests-per-worker", "0", "--max-request-bytes", str(2 * plan.rss_bytes)]
    with kc.kcoral_server(rss_args) as server:
        with kcoral.Client(server.url) as client:
            kc.trivial_round_trips(client, 1)
        rss = kc.peak_rss_while_moving(server.url, server.pid, plan.rss_bytes)
    results["rss"] = rss

    size = plan.bulk_bytes
    floor_cold = 2 * size * tcp + 4 * size * sha  # both directions; 4 hashes (see README)
    floor_warm = size * tcp + 2 * size * sha
    results["floors"] = {"bulk_cold_seconds": floor_cold, "bulk_warm_seconds": floor_warm}
    mib = f"{size // MIB} MiB"
    peak = max(rss["vm_hwm"], rss["peak_rss_sampled"])
    r8 = rates[8] / rates[1]
    rows += [
        Row("trivial round trip, reused workers, p50", ms(kc.median(trivial)),
            f"echo {ms(echo)}", kc.median(trivial) / echo, "<= 4x echo",
            judge(kc.median(trivial) / echo, 4)),
        Row("trivial, fresh worker, spaced 100 ms, p50", ms(kc.median(spaced)),
            f"echo {ms(echo)}", kc.median(spaced) / echo, "<= 6x echo",
            judge(kc.median(spaced) / echo, 6)),
        Row("trivial, fresh worker, back to back", f"{rate:.1f} req/s"),
        Row("worker start: spawn / preloaded fork", f"{ms(spawn)} / {ms(fork)}",
            f"python -c pass {ms(startup)}", spawn / fork, "report"),
        Row(f"{mib} bytes upload+return, cold", ms(cold), f"floor {ms(floor_cold)}",
            cold / floor_cold, "<= 1.6x floor", judge(cold / floor_cold, 1.6)),
        Row(f"{mib} bytes return, warm (cached)", ms(warm), f"floor {ms(floor_warm)}",
            warm / floor_warm, "<= 1.6x floor", judge(warm / floor_warm, 1.6)),
        Row(f"{mib} float32 tensor upload+return, cold", ms(tensor), f"floor {ms(floor_cold)}",
            tensor / floor_cold, "<= 1.8x floor", judge(tensor / floor_cold, 1.8)),
    ]  # fmt: skip
    for level, value in rates.items():
        rows.append(Row(f"{level} concurrent client(s), 2 reused workers", f"{value:.1f} req/s"))
    rows += [
        Row("8-client rate / 1-client rate", f"{r8:.2f}x", how, r8, ">= 1.5x",
            judge(r8, 1.5, at_least=True)),
        Row("front-end CPU per trivial request", ms(cpu), f"wall {ms(wall)}",
            cpu / 1e-3, "<= 1 ms (1000 req/s)", judge(cpu, 1e-3)),
        Row(f"front-end peak RSS, {plan.rss_bytes // MIB} MiB request",
            f"{peak / MIB:.0f} MiB", f"idle {rss['baseline_rss'] / MIB:.0f} MiB",
            peak / plan.rss_bytes, "<= 2.5x request", judge(peak / plan.rss_bytes, 2.5)),
        Row("raw loopback TCP / SHA-256 / memcpy", f"{1 / tcp / MIB:.0f} / {1 / sha / MIB:.0f}"
            f" / {1 / copy / MIB:.0f} MiB/s"),
    ]  # fmt: skip
    return rows, results


def print_table(rows: list[Row], machine: dict, out=sys.stdout) -> None:
    print("\nmachine:", file=out)
    print(
        f"  {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs "
        f"({machine['usable_cpus']} usable), {machine['memory_bytes'] / (1 << 30):.1f} GiB RAM",
        file=out,
    )
    print(f"  {machine['platform']}; Python {machine['python']}; {machine['openssl']}", file=out)
    print("  " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()), file=out)
    load = machine["load_average"], machine.get("load_average_end")
    print(f"  load average (1/5/15 min) at start {load[0]}, at end {load[1]}", file=out)
    header = ("measure", "median", "reference", "ratio", "target", "verdict")
    table = [header] + [
        (
            r.measure,
            r.value,
            r.reference,
            "" if r.ratio is None else f"{r.ratio:.2f}",
            r.target,
            r.verdict,
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    print(file=out)
    for i, line in enumerate(table):
        print(
            "| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |",
            file=out,
        )
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few iterations")
    parser.add_argument("--repeat", type=int, default=1, help="multiply every sample count")
    parser.add_argument("--json", type=Path, help="write all results to this file")
    parser.add_argument("--profile", type=Path, help="also profile trivial requests into DIR")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    machine = base.describe_machine()
    plan = make_plan(args.quick, args.repeat)
    rows, results = measure(plan, log)
    profile = None
    if args.profile is not None:
        import perf_profile

        log("profiling trivial requests")
        requests = 5 if args.quick else 50 * max(1, args.repeat)
        profile = perf_profile.profile_trivial(args.profile, requests)
    machine["load_average_end"] = list(os.getloadavg())
    print_table(rows, machine)
    if profile is not None:
        print("\n" + profile["summary"])
    if args.json is not None:
        document = {
            "machine": machine,
            "results": results,
            "rows": [asdict(r) for r in rows],
            "profile": profile,
        }
        args.json.write_text(json.dumps(document, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
