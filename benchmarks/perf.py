"""KCoral performance harness (issues 4, 22, 31): every measure, its baseline and target.

    python benchmarks/perf.py [--quick] [--repeat N] [--json PATH] [--profile DIR]
                              [--configuration default|sandbox-none ...]
                              [--ray-python PATH | --no-ray]

Prints one table: per row the configuration it was measured in, the median, the same-run
reference it is compared with, the ratio, the target and PASS/MISS (``info`` for rows
without a target). Timings are never asserted: MISS is information. The machine (CPU,
memory, versions) and its load average at the start and the end of the run are printed
and recorded in the JSON.

Configurations. The main rows are measured twice, on servers started

* with the server's default flags ("default flags": ``--sandbox auto``, i.e. bubblewrap
  where it runs, and the default per-worker limits), and
* with ``--sandbox none`` added ("--sandbox none"),

both on loopback in CPU mode with ``--log-dir ''``, ``--no-log-console`` and a private
``--disk-cache-dir``: event-log files and program records would measure the disk and
write into the working tree, and a disk cache warmed by an earlier run (or the user's own
``~/.cache``) would make cold rows warm. The resolved sandbox (``/v1/info``) is a row.

Main rows, per configuration (each configuration measures its own bare Tornado echo
baseline right before its servers start, through the same urllib3 transport as
``kcoral.Client``, with a body as large as the trivial request):

* trivial round trip on 2 reused workers (``--num-workers 2 --max-requests-per-worker 0``),
  p50 <= 2x echo;
* trivial round trip with a fresh worker per request (the default), spaced 100 ms, p50
  <= 4x echo; the same server back to back: req/s (info), p50 <= 4x the reused p50 and
  the median ``queue_ms`` the server reports <= 2 ms (each seat's next fresh worker is
  started ahead, issue 31). Back to back runs in three blocks, each right after as many
  trivial round trips on the reused-worker server, which stays up meanwhile (each block
  0.25 s after the other server's, its first 0.15 s of programs, at least 2, untimed): the
  ratio's reused p50 is those trips', so both sides see the same phases of the machine;
* trivial round trip on the reused-worker server, spaced 100 ms like the row above and
  measured right after it (report, with its ratio to the fresh worker's): what a
  notebook's next cell costs on a reused worker after the same pause;
* torch cell: a program whose module imports torch and makes a one-element tensor, on the
  fresh-worker server, alternating with the trivial programs above, p50 <= 1.3x trivial;
* front-end CPU (user + system of the ``kcoral server`` process) <= 1 ms and worker CPU
  (the childless processes below it, found with psutil: under bubblewrap ``bwrap`` -> seat
  launcher -> forked worker; the launchers' one-off torch preload is not a request's cost)
  <= 0.5 ms per sequential trivial request on the reused workers;
* 64 MiB ``bytes`` upload + return cold and return warm <= 1.4x the floor, float32 tensor
  cold <= 1.5x the floor; floor = raw loopback TCP time for the bytes moved + SHA-256 time
  for the hashes the protocol requires (cold: 2 x size moved, 4 x size hashed; warm: 1 x
  moved, 2 x hashed);
* 1, 2, 4 and 8 concurrent client *processes* (``perf_kcoral.py client``, one
  ``kcoral.Client`` each, so they share no GIL) on the 2 reused workers: each process is
  started, connects and runs two trivial requests, then all are released by one signal;
  rate = all requests / wall time; 8-process rate >= 1.5x the 1-process rate.

Once per run: front-end peak RSS moving 200 MiB (first configuration), worker start-up
(spawn vs preloaded fork, ``perf_workers.py``), raw loopback TCP / SHA-256 / memcpy speed,
and the Ray peer row: a trivial actor method call (actor created once and warmed,
``ray.get(actor.f.remote())``, p50) under ``ray.init(num_cpus=2, include_dashboard=False)``,
with the ratio KCoral reused trivial p50 / Ray p50 (target <= 3x, default flags). When
both configurations ran, "sandbox tax" rows give each main measure with default flags as a
ratio of the same measure with ``--sandbox none`` (target <= 1.15x, issue 31). Ray is no
project dependency and never enters the project's environment (it pins its own
grpcio/protobuf): ``perf_ray.py`` runs in ``--ray-python`` (default
``benchmarks/.ray-venv/bin/python``, created before anything is measured by
``setup_ray.sh`` when missing). When Ray cannot run, the row says why.

Rounds. The configurations' rows and Ray's calls are measured in ``--repeat`` rounds that
alternate between the configurations (default, none; none, default; ...), each round with
its share of the samples on servers of its own, Ray's calls right after the default-flags
round; each number is the median of its rounds (Ray's p50: of all its calls). The CPU
window is measured whole, in the first round. So every same-run ratio (sandbox tax, Ray,
back to back over reused) compares numbers taken in the same phases of the machine, not
minutes apart. Every timed series that follows a pause (the reused rows after the quiet
wait, both sides of each back-to-back block, Ray's calls) starts after
``MACHINE_WARM_SECONDS`` of untimed programs: after an idle moment the machine takes ~0.1 s
of round trips to reach its steady speed, and a series timed in that warm-up read ~50%
slow (README round 15). The spaced rows measure the pause on purpose.

``--quick`` uses tiny sizes and a few iterations, the default-flags configuration only and
no Ray (a smoke test run by ``tests/benchmarks/``, not a measurement). ``--repeat N``
multiplies every sample count and makes N rounds. ``--profile DIR`` adds a profile of
trivial requests (client cProfile, front-end py-spy, event-log phase timestamps) written to
DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_baselines as base
import perf_kcoral as kc
import perf_workers as workers

import kcoral

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
RAY_VENV = HERE / ".ray-venv"
DEFAULT_RAY_PYTHON = RAY_VENV / "bin" / "python"


@dataclass
class Row:
    """One line of the table; report-only measures have no ratio and the target "report".

    ``configuration`` names the server flags the row was measured with ("default flags",
    "--sandbox none") or "machine" for rows that start no KCoral server of their own.
    """

    configuration: str
    measure: str
    value: str
    reference: str = ""
    ratio: float | None = None
    target: str = "report"  # measured and shown, with no limit to meet
    verdict: str = "info"


@dataclass(frozen=True)
class Plan:
    bulk_bytes: int
    rss_bytes: int
    trivial: int
    spaced: int
    torch: int
    back_to_back: int
    bulk: int
    per_client: int
    cpu_requests: int
    starts: int
    raw_reps: int
    ray_calls: int
    #: rounds of the configurations' rows, alternating between them (``measure_in_rounds``)
    rounds: int = 1
    #: trivial programs on the reused workers before anything is timed
    warm_up_programs: int = 3


#: trivial programs before anything is timed on the reused workers: each of the two passes
#: its first full collection (frozen objects included, ~80-100 ms with torch loaded), which
#: comes after its 100th program (``worker.engine.FULL_COLLECTION_EVERY``), in every round;
#: else it lands in whichever row comes then (round 14: the tensor row of the rounds
#: without the CPU window, 275 -> ~395 ms), and the CPU window still holds the next one
PAST_FIRST_FULL_COLLECTION = 2 * 100 + 4


def make_plan(quick: bool, repeat: int) -> Plan:
    """Sample counts: ``--quick`` is a smoke test; otherwise ``repeat`` multiplies them."""
    if quick:
        return Plan(
            bulk_bytes=MIB, rss_bytes=4 * MIB, trivial=3, spaced=2, torch=1, back_to_back=2,
            bulk=2, per_client=1, cpu_requests=3, starts=1, raw_reps=2, ray_calls=3,
        )  # fmt: skip
    r = max(1, repeat)
    # A reused worker runs a full garbage collection (frozen objects included) after its
    # 100th program and then every FULL_COLLECTION_MAX_SPACING (2000) programs once torch
    # is loaded (~80 ms each): the CPU window spans 2100 programs per worker so it holds
    # that cost in its true proportion instead of all of it or none (a 150-request window
    # read 1.1-2 ms of worker CPU per request where the steady cost is ~0.5 ms).
    cpu_requests = max(50 * r, 2 * 2100)
    return Plan(
        bulk_bytes=64 * MIB, rss_bytes=200 * MIB, trivial=40 * r, spaced=15 * r, torch=5 * r,
        back_to_back=15 * r, bulk=5 * r, per_client=100 * r, cpu_requests=cpu_requests,
        starts=5 * r, raw_reps=5 * r, ray_calls=200 * r, rounds=r,
        warm_up_programs=PAST_FIRST_FULL_COLLECTION,
    )  # fmt: skip


def round_plan(plan: Plan) -> Plan:
    """One round's share of the configurations' samples and Ray's calls
    (``measure_in_rounds``). The CPU window is not shared out: it is measured whole, in the
    first round (see ``make_plan``)."""
    n = plan.rounds

    def share(count: int) -> int:
        return max(1, -(-count // n))

    return replace(
        plan, trivial=share(plan.trivial), spaced=share(plan.spaced), torch=share(plan.torch),
        back_to_back=share(plan.back_to_back), bulk=share(plan.bulk),
        per_client=share(plan.per_client), ray_calls=share(plan.ray_calls),
    )  # fmt: skip


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def judge(ratio: float, limit: float, *, at_least: bool = False) -> str:
    ok = ratio >= limit if at_least else ratio <= limit
    return "PASS" if ok else "MISS"


CONCURRENCY_LEVELS = (1, 2, 4, 8)


def measure_configuration(
    configuration: kc.Configuration,
    plan: Plan,
    log: Callable[[str], None],
    *,
    measure_cpu: bool = True,
) -> dict:
    """Every main row's numbers for one server configuration, with its own echo baseline
    measured right before (so load drift between configurations does not skew ratios);
    ``measure_cpu``: the CPU window too (one round measures it, ``measure_in_rounds``)."""
    name = configuration.name
    results: dict = {}
    log(f"[{name}] bare Tornado echo (urllib3, same transport as kcoral.Client)")
    body_size = kc.trivial_request_bytes()
    with base.echo_server() as echo_url:
        echo = kc.median(base.echo_round_trips(echo_url, body_size, plan.trivial))
    results["echo"] = {"body_bytes": body_size, "p50_seconds": echo}

    reused_args = ["--num-workers", "2", "--max-requests-per-worker", "0"]
    reused_args += ["--cache-capacity-bytes", str(max(1024 * MIB, 8 * plan.bulk_bytes))]
    with (
        kc.kcoral_server(reused_args, configuration=configuration) as server,
        kcoral.Client(server.url) as client,
    ):
        results["sandbox"] = kc.resolved_sandbox(server.url)
        log(f"[{name}] warming both reused workers (sandbox: {results['sandbox']})")
        kc.warm_up_workers(server.url, 2)
        kc.trivial_round_trips(client, plan.warm_up_programs)
        results["quiet_wait_seconds"] = kc.wait_until_quiet(server.pid)
        log(f"[{name}] trivial round trips, reused workers")
        kc.warm_machine(client)  # the quiet wait left the machine idle (MACHINE_WARM_SECONDS)
        trivial = kc.trivial_round_trips(client, plan.trivial)
        log(f"[{name}] remote functions (json, pickle) and session programs")
        remote = kc.remote_function_round_trips(client, plan.trivial)
        session = kc.session_round_trips(client, plan.trivial)
        cpu = None
        if measure_cpu:
            log(f"[{name}] front-end and worker CPU per trivial request")
            cpu = kc.cpu_per_request(client, server.pid, plan.cpu_requests)
        log(f"[{name}] {plan.bulk_bytes // MIB} MiB bytes cold / warm, tensor cold")
        kc.bytes_cold(client, plan.bulk_bytes, 1)  # first big transfer sizes the buffers
        cold = kc.median(kc.bytes_cold(client, plan.bulk_bytes, plan.bulk))
        warm = kc.median(kc.bytes_warm(client, plan.bulk_bytes, plan.bulk))
        kc.tensor_cold(client, plan.bulk_bytes, 1)
        tensor = kc.median(kc.tensor_cold(client, plan.bulk_bytes, plan.bulk))
        log(f"[{name}] concurrent client processes {CONCURRENCY_LEVELS}")
        rates = kc.concurrent_process_rates(server.url, CONCURRENCY_LEVELS, plan.per_client)
        # the reused server stays up: back to back alternates with its trivial trips
        results["fresh"] = measure_fresh_workers(configuration, plan, log, reused=client)
    results["reused"] = {
        "trivial_p50_seconds": kc.median(trivial),
        "trivial_p90_seconds": kc.p90(trivial),
        "remote_json_p50_seconds": kc.median(remote["json"]),
        "remote_pickle_p50_seconds": kc.median(remote["pickle"]),
        "session_p50_seconds": kc.median(session),
        "bytes_cold_seconds": cold,
        "bytes_warm_seconds": warm,
        "tensor_cold_seconds": tensor,
        "concurrency_client": "client processes, one kcoral.Client each",
        "concurrency_rates": {str(k): v for k, v in rates.items()},
    }
    if cpu is not None:
        results["reused"]["frontend_cpu_seconds_per_request"] = cpu.frontend
        results["reused"]["worker_cpu_seconds_per_request"] = cpu.workers
        results["reused"]["wall_seconds_per_request"] = cpu.wall
    return results


def measure_in_rounds(
    configurations: list[kc.Configuration],
    plan: Plan,
    ray_python: Path | None,
    log: Callable[[str], None],
) -> tuple[dict[str, dict], dict]:
    """Each configuration's numbers, and Ray's (``ray_row_results``), measured in
    ``plan.rounds`` rounds that alternate between the configurations (A B, B A, A B, ...),
    each round with its share of the samples, Ray's calls right after the first
    configuration's (whose reused trip Ray's ratio divides); a number is the median of its
    rounds. Measured one configuration after the other, a same-run ratio compared two
    phases of the machine minutes apart (README round 14)."""
    share = round_plan(plan)
    rounds: dict[str, list[dict]] = {c.name: [] for c in configurations}
    ray_rounds: list[dict] = []
    for index in range(plan.rounds):
        order = configurations if index % 2 == 0 else configurations[::-1]
        for configuration in order:
            log(f"round {index + 1} of {plan.rounds}: {configuration.name}")
            measured = measure_configuration(configuration, share, log, measure_cpu=index == 0)
            rounds[configuration.name].append(measured)
            if configuration is configurations[0]:
                ray_rounds.append(ray_row_results(ray_python, share.ray_calls, log))
    ray = next((r for r in ray_rounds if "skipped" in r), None) or ray_of_rounds(ray_rounds)
    combined = {name: median_of_rounds(measured) for name, measured in rounds.items()}
    for name, measured in rounds.items():
        combined[name]["rounds"] = measured  # every round's own numbers, in the JSON
    return combined, ray


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def median_of_rounds(rounds: list[dict]) -> dict:
    """One result from the rounds' results: each number the median of the rounds that have
    it, each mapping combined alike, anything else (a name) the first round's."""
    combined: dict = {}
    for key in dict.fromkeys(key for measured in rounds for key in measured):
        values = [measured[key] for measured in rounds if key in measured]
        if all(isinstance(value, dict) for value in values):
            combined[key] = median_of_rounds(values)
        elif all(_is_number(value) for value in values):
            combined[key] = kc.median(values)
        else:
            combined[key] = values[0]
    return combined


def measure_fresh_workers(
    configuration: kc.Configuration,
    plan: Plan,
    log: Callable[[str], None],
    *,
    reused: kcoral.Client,
) -> dict:
    """The fresh-worker rows, on a server with the default one fresh worker per program;
    back to back in blocks that alternate with trivial round trips on ``reused``, the
    reused-worker server of the same configuration (``back_to_back_beside_reused``)."""
    name = configuration.name
    with (
        kc.kcoral_server([], configuration=configuration) as server,
        kcoral.Client(server.url) as client,
    ):
        log(f"[{name}] fresh worker per request: trivial and torch cells spaced 100 ms")
        kc.trivial_round_trips(client, 2, spacing=0.5)
        quiet_wait = kc.wait_until_quiet(server.pid)
        spaced, torch = kc.alternating_round_trips(client, plan.spaced, plan.torch, spacing=0.1)
        # what a notebook's next cell costs on a reused worker after the same pause: the
        # machine's wake-up from idle is in both (issue 31, README round 15)
        spaced_reused = kc.trivial_round_trips(reused, plan.spaced, spacing=0.1)
        log(f"[{name}] fresh worker per request: back to back, in blocks between reused trips")
        back = kc.back_to_back_beside_reused(client, reused, plan.back_to_back)
    return {
        "spaced_p50_seconds": kc.median(spaced),
        "spaced_p90_seconds": kc.p90(spaced),
        "spaced_reused_p50_seconds": kc.median(spaced_reused),
        "torch_cell_p50_seconds": kc.median(torch),
        "back_to_back_per_second": back["per_second"],
        "back_to_back_p50_seconds": back["p50_seconds"],
        "back_to_back_queue_ms_median": back["queue_ms_median"],
        "back_to_back_reused_p50_seconds": back["reused_p50_seconds"],
        "quiet_wait_seconds": quiet_wait,
    }


#: the reused-worker calls beside a plain program (issue 31): results key, row
CALL_MEASURES = (
    ("remote_json_p50_seconds", "remote function call (json), reused workers, p50"),
    ("remote_pickle_p50_seconds", "remote function call (pickle), reused workers, p50"),
    ("session_p50_seconds", "trivial program in a session, p50"),
)


def configuration_rows(name: str, results: dict, floors: dict, plan: Plan) -> list[Row]:
    echo = results["echo"]["p50_seconds"]
    reused, fresh = results["reused"], results["fresh"]
    trivial, spaced = reused["trivial_p50_seconds"], fresh["spaced_p50_seconds"]
    spaced_reused = fresh["spaced_reused_p50_seconds"]
    torch = fresh["torch_cell_p50_seconds"]
    back, queued = fresh["back_to_back_p50_seconds"], fresh["back_to_back_queue_ms_median"]
    # the reused trip measured in the blocks alternating with back to back
    beside = fresh["back_to_back_reused_p50_seconds"]
    cold, warm = reused["bytes_cold_seconds"], reused["bytes_warm_seconds"]
    tensor = reused["tensor_cold_seconds"]
    floor_cold, floor_warm = floors["bulk_cold_seconds"], floors["bulk_warm_seconds"]
    frontend_cpu = reused["frontend_cpu_seconds_per_request"]
    worker_cpu = reused["worker_cpu_seconds_per_request"]
    wall = reused["wall_seconds_per_request"]
    rates = {int(k): v for k, v in reused["concurrency_rates"].items()}
    r8 = rates[8] / rates[1]
    mib = f"{plan.bulk_bytes // MIB} MiB"
    rows = [
        Row(name, "sandbox (resolved, /v1/info)", results["sandbox"]),
        Row(name, "trivial round trip, reused workers, p50", ms(trivial), f"echo {ms(echo)}",
            trivial / echo, "<= 2x echo", judge(trivial / echo, 2)),
        *(Row(name, measure, ms(reused[key]), f"trivial {ms(trivial)}", reused[key] / trivial,
              "report") for key, measure in CALL_MEASURES),
        Row(name, "trivial, fresh worker, spaced 100 ms, p50", ms(spaced), f"echo {ms(echo)}",
            spaced / echo, "<= 4x echo", judge(spaced / echo, 4)),
        Row(name, "trivial, reused worker, spaced 100 ms, p50", ms(spaced_reused),
            f"fresh worker spaced {ms(spaced)}", spaced_reused / spaced, "report"),
        Row(name, "torch cell, fresh worker, spaced 100 ms, p50", ms(torch),
            f"trivial {ms(spaced)}", torch / spaced, "<= 1.3x trivial", judge(torch / spaced, 1.3)),
        Row(name, "trivial, fresh worker, back to back", f"{fresh['back_to_back_per_second']:.1f}"
            " req/s"),
        Row(name, "trivial, fresh worker, back to back, p50", ms(back),
            f"reused {ms(beside)}, blocks alternating", back / beside, "<= 4x reused",
            judge(back / beside, 4)),
        Row(name, "queue_ms, fresh worker, back to back, median", f"{queued:.2f} ms",
            "the wait for the seat's next worker", queued, "<= 2 ms", judge(queued, 2)),
        Row(name, "front-end CPU per trivial request", ms(frontend_cpu), f"wall {ms(wall)}",
            frontend_cpu / 1e-3, "<= 1 ms (1000 req/s)", judge(frontend_cpu, 1e-3)),
        Row(name, "worker CPU per trivial request", ms(worker_cpu), f"wall {ms(wall)}",
            worker_cpu / 0.5e-3, "<= 0.5 ms", judge(worker_cpu, 0.5e-3)),
        Row(name, f"{mib} bytes upload+return, cold", ms(cold), f"floor {ms(floor_cold)}",
            cold / floor_cold, "<= 1.4x floor", judge(cold / floor_cold, 1.4)),
        Row(name, f"{mib} bytes return, warm (cached)", ms(warm), f"floor {ms(floor_warm)}",
            warm / floor_warm, "<= 1.4x floor", judge(warm / floor_warm, 1.4)),
        Row(name, f"{mib} float32 tensor upload+return, cold", ms(tensor),
            f"floor {ms(floor_cold)}", tensor / floor_cold, "<= 1.5x floor",
            judge(tensor / floor_cold, 1.5)),
    ]  # fmt: skip
    for level, value in rates.items():
        label = "process" if level == 1 else "processes"
        rows.append(
            Row(name, f"{level} concurrent client {label}, 2 reused workers", f"{value:.1f} req/s")
        )
    rows.append(
        Row(name, "8-process rate / 1-process rate", f"{r8:.2f}x", "one kcoral.Client each", r8,
            ">= 1.5x", judge(r8, 1.5, at_least=True))
    )  # fmt: skip
    return rows


def measure(
    plan: Plan,
    configurations: list[kc.Configuration],
    ray_python: Path | None,
    log: Callable[[str], None],
) -> tuple[list[Row], dict]:
    results: dict = {"plan": asdict(plan), "configurations": {}}
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
    size = plan.bulk_bytes
    floors = {
        "bulk_cold_seconds": 2 * size * tcp + 4 * size * sha,  # both ways; 4 hashes (README)
        "bulk_warm_seconds": size * tcp + 2 * size * sha,
    }
    results["floors"] = floors

    results["configurations"], results["ray"] = measure_in_rounds(
        configurations, plan, ray_python, log
    )
    for configuration in configurations:
        measured = results["configurations"][configuration.name]
        rows += configuration_rows(configuration.name, measured, floors, plan)
    rows += sandbox_tax_rows(results["configurations"])

    log("worker start: spawn vs preloaded fork")
    spawn = kc.median(workers.spawn_start_seconds(plan.starts))
    fork = kc.median(workers.fork_start_seconds(plan.starts))
    results["worker_start"] = {"spawn_seconds": spawn, "fork_seconds": fork}

    first = configurations[0]
    log(f"front-end peak RSS while moving {plan.rss_bytes // MIB} MiB ({first.name})")
    rss_args = ["--max-requests-per-worker", "0", "--max-request-bytes", str(2 * plan.rss_bytes)]
    with kc.kcoral_server(rss_args, configuration=first) as server:
        with kcoral.Client(server.url) as client:
            kc.trivial_round_trips(client, 1)
        rss = kc.peak_rss_while_moving(server.url, server.pid, plan.rss_bytes)
    results["rss"] = {**rss, "configuration": first.name}
    peak = max(rss["vm_hwm"], rss["peak_rss_sampled"])

    ray_results = results["ray"]
    reference = results["configurations"][first.name]["reused"]["trivial_p50_seconds"]
    rows += [
        ray_row(ray_results, reference, first.name),
        *ray_ratio_rows(ray_results, results["configurations"][first.name]["reused"], first.name),
        Row("machine", "worker start: spawn / preloaded fork", f"{ms(spawn)} / {ms(fork)}",
            f"python -c pass {ms(startup)}", spawn / fork, "report"),
        Row(first.name, f"front-end peak RSS, {plan.rss_bytes // MIB} MiB request",
            f"{peak / MIB:.0f} MiB", f"idle {rss['baseline_rss'] / MIB:.0f} MiB",
            peak / plan.rss_bytes, "<= 2.5x request", judge(peak / plan.rss_bytes, 2.5)),
        Row("machine", "raw loopback TCP / SHA-256 / memcpy", f"{1 / tcp / MIB:.0f} / "
            f"{1 / sha / MIB:.0f} / {1 / copy / MIB:.0f} MiB/s"),
    ]  # fmt: skip
    return rows, results


#: the rows compared across configurations (issue 31): default flags / --sandbox none
SANDBOX_TAX_MEASURES = (
    ("reused", "trivial_p50_seconds", "trivial round trip, reused workers, p50"),
    *(("reused", key, measure) for key, measure in CALL_MEASURES),
    ("fresh", "spaced_p50_seconds", "trivial, fresh worker, spaced 100 ms, p50"),
    ("fresh", "spaced_reused_p50_seconds", "trivial, reused worker, spaced 100 ms, p50"),
    ("fresh", "back_to_back_p50_seconds", "trivial, fresh worker, back to back, p50"),
    ("fresh", "torch_cell_p50_seconds", "torch cell, fresh worker, spaced 100 ms, p50"),
    ("reused", "frontend_cpu_seconds_per_request", "front-end CPU per trivial request"),
    ("reused", "worker_cpu_seconds_per_request", "worker CPU per trivial request"),
    ("reused", "bytes_cold_seconds", "64 MiB bytes upload+return, cold"),
    ("reused", "bytes_warm_seconds", "64 MiB bytes return, warm (cached)"),
    ("reused", "tensor_cold_seconds", "64 MiB float32 tensor upload+return, cold"),
)
SANDBOX_TAX_TARGET = 1.15


def sandbox_tax_rows(configurations: dict) -> list[Row]:
    """Each measure with default flags as a ratio of the same measure with ``--sandbox
    none``, same run (target <= 1.15x); nothing when either configuration did not run."""
    default = configurations.get(kc.DEFAULT_FLAGS.name)
    bare = configurations.get(kc.SANDBOX_NONE.name)
    if default is None or bare is None:
        return []
    rows = []
    for group, key, measure in SANDBOX_TAX_MEASURES:
        ours, reference = default[group][key], bare[group][key]
        ratio = ours / reference if reference else float("inf")
        rows.append(
            Row("sandbox tax", measure, ms(ours), f"--sandbox none {ms(reference)}", ratio,
                f"<= {SANDBOX_TAX_TARGET}x", judge(ratio, SANDBOX_TAX_TARGET))
        )  # fmt: skip
    return rows


RAY_ROW = "Ray actor call round trip, p50 (peer)"
RAY_TARGET = 3.0


def ray_row_results(ray_python: Path | None, calls: int, log: Callable[[str], None]) -> dict:
    """Run ``perf_ray.py`` (``calls`` timed calls) in Ray's own interpreter; ``{"skipped":
    why}`` when it cannot."""
    if ray_python is None:
        return {"skipped": "skipped (--quick or --no-ray)"}
    if not ray_python.exists():
        return {"skipped": f"{ray_python} missing: run benchmarks/setup_ray.sh"}
    log(f"Ray actor calls ({ray_python})")
    # the actor warmed as long as KCoral's series warm the machine
    command = [str(ray_python), str(HERE / "perf_ray.py"), str(calls), str(kc.MACHINE_WARM_SECONDS)]
    try:
        # No usage report to Ray's servers: the run is offline, and a request out would
        # add its time and traffic to the measurement.
        environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=600, env=environment
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"skipped": f"Ray did not run: {exc}"}
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        return {"skipped": f"Ray failed (exit {completed.returncode}): {_why(completed.stderr)}"}
    try:
        document = json.loads(lines[-1])
        samples = [float(s) for s in document["samples"]]
    except (ValueError, KeyError, TypeError) as exc:
        return {"skipped": f"Ray answered something else: {exc}"}
    return {
        "version": document.get("ray"),
        "p50_seconds": kc.median(samples),
        "p90_seconds": kc.p90(samples),
        "init_seconds": document.get("init_seconds"),
        "calls": len(samples),
        "samples": samples,
    }


def ray_of_rounds(rounds: list[dict]) -> dict:
    """One Ray result from the rounds' (none skipped): p50 and p90 over all their calls."""
    samples = [sample for measured in rounds for sample in measured["samples"]]
    return {
        "version": rounds[0]["version"],
        "p50_seconds": kc.median(samples),
        "p90_seconds": kc.p90(samples),
        "init_seconds": kc.median([measured["init_seconds"] or 0.0 for measured in rounds]),
        "calls": len(samples),
        "rounds": len(rounds),
        "round_p50_seconds": [measured["p50_seconds"] for measured in rounds],
    }


def _why(stderr: str) -> str:
    """The line of a failed run's stderr that names the error (Ray logs a lot around it)."""
    lines = stderr.strip().splitlines() or ["no output"]
    named = [line for line in lines if "Error" in line or "error" in line]
    return (named or lines)[-1].strip()[:160]


def ray_row(ray: dict, kcoral_trivial: float, configuration: str) -> Row:
    """The peer row: Ray's p50 and how many Ray calls fit in one KCoral trivial request."""
    if "skipped" in ray:
        return Row("machine", RAY_ROW, "not measured", ray["skipped"])
    return Row(
        "machine",
        RAY_ROW,
        ms(ray["p50_seconds"]),
        f"kcoral reused {ms(kcoral_trivial)} ({configuration})",
        kcoral_trivial / ray["p50_seconds"],
        f"kcoral/ray <= {RAY_TARGET:g}x (ray {ray['version']})",
        judge(kcoral_trivial / ray["p50_seconds"], RAY_TARGET),
    )


def ray_ratio_rows(ray: dict, reused: dict, configuration: str) -> list[Row]:
    """A remote function call and a session program as ratios of the Ray actor call, same
    run (report: Ray's call carries no program, upload or sandbox)."""
    if "skipped" in ray:
        return []
    rows = []
    for key, measure in (
        ("remote_json_p50_seconds", "remote function call (json) / Ray actor call"),
        ("remote_pickle_p50_seconds", "remote function call (pickle) / Ray actor call"),
        ("session_p50_seconds", "session program / Ray actor call"),
    ):
        ratio = reused[key] / ray["p50_seconds"]
        rows.append(
            Row("machine", measure, ms(reused[key]), f"ray {ms(ray['p50_seconds'])} "
                f"({configuration})", ratio, "report")
        )  # fmt: skip
    return rows


def print_table(rows: list[Row], machine: dict, results: dict, out=sys.stdout) -> None:
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
    print("configurations:", file=out)
    for name, measured in results["configurations"].items():
        flags = " ".join(kc.CONFIGURATIONS_BY_NAME[name].flags) or "(none added)"
        print(f"  {name}: server flags {flags}; sandbox resolved: {measured['sandbox']}", file=out)
    header = ("configuration", "measure", "median", "reference", "ratio", "target", "verdict")
    table = [header] + [
        (
            r.configuration,
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
    parser.add_argument(
        "--configuration",
        choices=sorted(kc.CONFIGURATIONS),
        action="append",
        help="server configuration(s) to measure (default: both; --quick: default only)",
    )
    parser.add_argument(
        "--ray-python",
        type=Path,
        help=f"interpreter with ray installed (default: {DEFAULT_RAY_PYTHON}, made on demand "
        "by benchmarks/setup_ray.sh)",
    )
    parser.add_argument("--no-ray", action="store_true", help="leave the Ray peer row out")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    started = time.monotonic()
    machine = base.describe_machine()
    log(f"load average (1/5/15 min) at start: {machine['load_average']}")
    names = args.configuration or (["default"] if args.quick else ["default", "sandbox-none"])
    configurations = [kc.CONFIGURATIONS[name] for name in dict.fromkeys(names)]
    ray_python = choose_ray_python(args, log)
    plan = make_plan(args.quick, args.repeat)
    rows, results = measure(plan, configurations, ray_python, log)
    profile = None
    if args.profile is not None:
        import perf_profile

        log("profiling trivial requests")
        requests = 5 if args.quick else 50 * max(1, args.repeat)
        profile = perf_profile.profile_trivial(args.profile, requests, tuple(configurations))
    machine["load_average_end"] = list(os.getloadavg())
    machine["run_seconds"] = time.monotonic() - started
    log(f"load average (1/5/15 min) at end: {machine['load_average_end']}")
    print_table(rows, machine, results)
    print(f"\nrun took {machine['run_seconds']:.0f} s")
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


def choose_ray_python(args: argparse.Namespace, log: Callable[[str], None]) -> Path | None:
    """The Ray interpreter to use, or None to skip the row.

    An explicit ``--ray-python`` is used as given; otherwise the default venv is created on
    demand (``setup_ray.sh`` needs the package index) before anything is measured, so the
    install does not load the machine during a measurement.
    """
    if args.no_ray or (args.quick and args.ray_python is None):
        return None
    if args.ray_python is not None:
        return args.ray_python
    if not (DEFAULT_RAY_PYTHON.exists() and any(RAY_VENV.glob("lib/python*/site-packages/ray"))):
        log("creating benchmarks/.ray-venv (setup_ray.sh: python -m venv + pip install ray)")
        setup = subprocess.run(
            ["sh", str(HERE / "setup_ray.sh")], capture_output=True, text=True, timeout=1800
        )
        if setup.returncode != 0:
            tail = (setup.stderr.strip().splitlines() or ["no output"])[-1]
            log(f"setup_ray.sh failed (exit {setup.returncode}): {tail}")
    return DEFAULT_RAY_PYTHON


if __name__ == "__main__":
    sys.exit(main())
