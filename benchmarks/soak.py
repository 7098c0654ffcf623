"""Soak test: many mixed ``/execute`` requests from concurrent clients against one server.

    python benchmarks/soak.py                    # 20,000 requests, 16 clients, 2 workers
    python benchmarks/soak.py --requests 400 --json soak.json

Starts a real ``kcoral server --device cpu --num-workers 2`` (reused workers, private
``TMPDIR``, disk cache and log directory), then sends a fixed mix of programs over raw
keep-alive HTTP/1.1 connections: trivial calls, a 1 MiB ``bytes`` upload echoed back, calls
that raise (``FAILED``), and calls that outlive a short deadline (504, the worker is killed
and replaced). Every answer is checked against the outcome its kind must have. Reports
throughput, p50/p99 latency, answers per outcome, 503s, and the server's resources (front-end
RSS and descriptors, descendant processes, workspaces) at start, peak and end; exits 1 when
an answer was unexpected or a resource grew beyond its bound.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MIB = 1 << 20
BOUNDARY = "soak-boundary-5f3a"
# Growth allowed between the settled start and end measurements.
FD_SLACK = 4
RSS_SLACK_BYTES = 256 * MIB

PAYLOAD = bytes(range(256)) * (MIB // 256)
PAYLOAD_HASH = hashlib.sha256(PAYLOAD).hexdigest()
SOURCE = """
import time
def trivial(x):
    return x + 1
def echo(data):
    return data
def fail(x):
    raise ValueError(f"soak failure {x}")
def slow(seconds):
    time.sleep(seconds)
"""


def _program(function: str, args: list, *, blob: bool = False, **options: Any) -> dict:
    instructions: list[dict] = [
        {"op": "upload", "id": "m", "kind": "module", "source": SOURCE},
        {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": function},
    ]
    if blob:
        instructions.append({"op": "upload", "id": "b", "kind": "bytes", "blob": PAYLOAD_HASH})
    instructions += [
        {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": args},
        {"op": "return", "key": "value", "value": {"$ref": "r"}},
    ]
    return {"instructions": instructions, "options": options}


def _body(program: dict, blobs: dict[str, bytes]) -> bytes:
    def part(name: str, content_type: str, data: bytes) -> bytes:
        head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n'
        return (head + f"Content-Type: {content_type}\r\n\r\n").encode() + data + b"\r\n"

    chunks = [part("program", "application/json", json.dumps(program).encode())]
    chunks += [part(f"blob:{h}", "application/octet-stream", b) for h, b in blobs.items()]
    return b"".join(chunks) + f"--{BOUNDARY}--\r\n".encode()


@dataclass(frozen=True)
class Kind:
    """One kind of request in the mix and the only outcome it may have."""

    name: str
    weight: int
    body: bytes
    expect: str  # "<http status> <status or error kind>"


def request_mix(timeout_seconds: float) -> list[Kind]:
    echo = _program("echo", [{"$ref": "b"}], blob=True)
    slow = _program("slow", [30], timeout_seconds=timeout_seconds)
    return [
        Kind("trivial", 70, _body(_program("trivial", [41]), {}), "200 COMPLETED"),
        Kind("bytes_1mib", 17, _body(echo, {PAYLOAD_HASH: PAYLOAD}), "200 COMPLETED"),
        Kind("failing", 12, _body(_program("fail", [1]), {}), "200 FAILED runtime"),
        Kind("timing_out", 1, _body(slow, {}), "504 timeout"),
    ]


def schedule(mix: list[Kind], count: int) -> list[Kind]:
    """A deterministic interleaving: every block of 100 requests has the mix's weights."""
    block = [kind for kind in mix for _ in range(kind.weight)]
    stride = 37  # coprime with 100: spreads each kind through the block
    order = [block[(i * stride) % len(block)] for i in range(len(block))]
    return [order[i % len(order)] for i in range(count)]


# ------------------------------------------------------------------ resources


@dataclass
class Resources:
    rss_bytes: int
    tree_rss_bytes: int
    fds: int
    processes: int
    workspaces: int


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def _descendants(pid: int) -> list[int]:
    seen: list[int] = []
    pending = [pid]
    while pending:
        for child in _children(pending.pop()):
            if child not in seen:
                seen.append(child)
                pending.append(child)
    return seen


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(pid: int, temp_dir: Path) -> Resources:
    tree = _descendants(pid)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = -1
    return Resources(
        rss_bytes=_rss(pid),
        tree_rss_bytes=_rss(pid) + sum(_rss(p) for p in tree),
        fds=fds,
        processes=len(tree),
        workspaces=len(list(temp_dir.glob("kcoral-program-*"))),
    )


def settled(pid: int, temp_dir: Path, reference: Resources | None, timeout: float) -> Resources:
    """Measure once replacement workers are back and workspaces are gone (or at timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        now = measure(pid, temp_dir)
        calm = now.workspaces == 0 and (
            reference is None or (now.processes == reference.processes and now.fds <= reference.fds)
        )
        if calm or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def _wait_for_full_capacity(url: str, workers: int, timeout: float) -> None:
    """Until ``/health`` shows every seat live and idle (replacements run in the background)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("GET", "/health")
            load = json.loads(connection.getresponse().read())["load"]
        finally:
            connection.close()
        if load["request_capacity"] == workers and load["requests_in_progress"] == 0:
            return
        time.sleep(0.1)


# ------------------------------------------------------------------ the run


@dataclass
class SoakReport:
    requests: int
    clients: int
    workers: int
    seconds: float
    throughput_rps: float
    latency_ms: dict[str, float]
    latency_ms_by_kind: dict[str, dict[str, float]]
    outcomes: dict[str, int]
    unexpected: dict[str, int]
    busy_503: int
    transport_errors: int
    start: Resources
    peak: Resources
    end: Resources
    growth: dict[str, int]
    bounded: bool
    ok: bool
    mix: dict[str, int] = field(default_factory=dict)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "p50": round(statistics.median(ordered), 2),
        "p99": round(pick(0.99), 2),
        "max": round(ordered[-1], 2),
    }


def _outcome(status: int, raw: bytes, content_type: str) -> str:
    if content_type.startswith("multipart/"):
        start = raw.find(b"\r\n\r\n") + 4
        end = raw.find(b"\r\n--", start)
        body = json.loads(raw[start:end])
    else:
        body = json.loads(raw)
    if status == 200:
        label = body["status"]
        if label == "FAILED":
            label += " " + body["error"]["kind"]
        return f"200 {label}"
    return f"{status} {body['error']['kind']}"


def _client(url: str, jobs: list[tuple[int, Kind]], results: list, lock: threading.Lock) -> None:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    connection: http.client.HTTPConnection | None = None
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    for index, kind in jobs:
        started = time.perf_counter()
        try:
            if connection is None:
                connection = http.client.HTTPConnection(host, int(port), timeout=120)
            connection.request("POST", "/execute", kind.body, headers)
            response = connection.getresponse()
            raw = response.read()
            outcome = _outcome(response.status, raw, response.getheader("Content-Type", ""))
            if response.getheader("Connection", "").lower() == "close":
                connection.close()
                connection = None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            outcome = f"transport {type(exc).__name__}"
            if connection is not None:
                connection.close()
            connection = None
        elapsed = (time.perf_counter() - started) * 1000.0
        with lock:
            results[index] = (kind, outcome, elapsed)
    if connection is not None:
        connection.close()


def start_server(directory: Path, workers: int) -> tuple[subprocess.Popen, str, Path]:
    temp_dir = directory / "tmp"
    temp_dir.mkdir(parents=True)
    ready = directory / "ready"
    command = [
        sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--sandbox", "none",
        "--port", "0", "--ready-file", str(ready), "--num-workers", str(workers),
        "--max-requests-per-worker", "0", "--worker-termination-grace-seconds", "1",
        "--disk-cache-dir", str(directory / "disk-cache"), "--log-dir", str(directory / "logs"),
        "--no-log-console",
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(temp_dir)}
    env.pop("KCORAL_AUTH_TOKEN", None)
    with open(directory / "server.stderr", "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError((directory / "server.stderr").read_text(errors="replace"))
        time.sleep(0.05)
    return process, ready.read_text().strip(), temp_dir


def run_soak(
    requests: int = 20_000,
    clients: int = 16,
    workers: int = 2,
    timeout_seconds: float = 0.3,
    directory: Path | None = None,
) -> SoakReport:
    """Start a server, run the mix, stop the server; returns the report."""
    with tempfile.TemporaryDirectory(prefix="kcoral-soak-") as scratch:
        base = Path(directory or scratch)
        process, url, temp_dir = start_server(base / "server", workers)
        try:
            return _soak(process.pid, url, temp_dir, requests, clients, workers, timeout_seconds)
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _soak(
    pid: int,
    url: str,
    temp_dir: Path,
    requests: int,
    clients: int,
    workers: int,
    timeout_seconds: float,
) -> SoakReport:
    mix = request_mix(timeout_seconds)
    # Warm-up: every kind once per worker, outside the measurement.
    warm_jobs = [(i, kind) for i, kind in enumerate(mix * workers)]
    warm_results: list = [None] * len(warm_jobs)
    _client(url, warm_jobs, warm_results, threading.Lock())
    _wait_for_full_capacity(url, workers, 60)  # the warm-up's timeout replaced a worker
    start = settled(pid, temp_dir, None, 30)
    start = settled(pid, temp_dir, start, 30)

    plan = schedule(mix, requests)
    results: list = [None] * requests
    lock = threading.Lock()
    shares = [[(i, plan[i]) for i in range(c, requests, clients)] for c in range(clients)]
    peak = measure(pid, temp_dir)
    stop = threading.Event()

    def monitor() -> None:
        nonlocal peak
        while not stop.wait(0.25):
            now = measure(pid, temp_dir)
            peak = Resources(
                *(
                    max(a, b)
                    for a, b in zip(asdict(peak).values(), asdict(now).values(), strict=True)
                )
            )

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    began = time.perf_counter()
    threads = [
        threading.Thread(target=_client, args=(url, share, results, lock)) for share in shares
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    stop.set()
    watcher.join()
    _wait_for_full_capacity(url, workers, 60)
    end = settled(pid, temp_dir, start, 60)

    outcomes: Counter[str] = Counter()
    unexpected: Counter[str] = Counter()
    latencies: list[float] = []
    by_kind: dict[str, list[float]] = {kind.name: [] for kind in mix}
    for kind, outcome, elapsed in results:
        outcomes[outcome] += 1
        latencies.append(elapsed)
        by_kind[kind.name].append(elapsed)
        if outcome != kind.expect and outcome != "503 busy":
            unexpected[f"{kind.name}: {outcome}"] += 1
    growth = {
        "fds": end.fds - start.fds,
        "processes": end.processes - start.processes,
        "workspaces": end.workspaces - start.workspaces,
        "rss_bytes": end.rss_bytes - start.rss_bytes,
    }
    bounded = (
        growth["fds"] <= FD_SLACK
        and growth["processes"] == 0
        and end.workspaces == 0
        and growth["rss_bytes"] <= RSS_SLACK_BYTES
    )
    transport = sum(n for name, n in outcomes.items() if name.startswith("transport"))
    return SoakReport(
        requests=requests,
        clients=clients,
        workers=workers,
        seconds=round(seconds, 2),
        throughput_rps=round(requests / seconds, 1),
        latency_ms=_percentiles(latencies),
        latency_ms_by_kind={name: _percentiles(values) for name, values in by_kind.items()},
        outcomes=dict(outcomes.most_common()),
        unexpected=dict(unexpected),
        busy_503=outcomes.get("503 busy", 0),
        transport_errors=transport,
        start=start,
        peak=peak,
        end=end,
        growth=growth,
        bounded=bounded,
        ok=bounded and not unexpected,
        mix={kind.name: kind.weight for kind in mix},
    )


def format_report(report: SoakReport) -> str:
    mib = lambda n: f"{n / MIB:.1f} MiB"  # noqa: E731
    lines = [
        f"soak: {report.requests} requests, {report.clients} clients, {report.workers} workers, "
        f"mix {report.mix} (% per kind)",
        f"  time {report.seconds} s, throughput {report.throughput_rps} requests/s",
        f"  latency ms: p50 {report.latency_ms['p50']}, p99 {report.latency_ms['p99']}, "
        f"max {report.latency_ms['max']}",
    ]
    for name, values in report.latency_ms_by_kind.items():
        lines.append(f"    {name:<11} p50 {values['p50']:>9}  p99 {values['p99']:>9}")
    lines.append(f"  outcomes: {report.outcomes}")
    lines.append(f"  503 busy: {report.busy_503}, transport errors: {report.transport_errors}")
    lines.append(f"  unexpected answers: {report.unexpected or 'none'}")
    lines.append("  resources        start        peak         end")
    for name in ("rss_bytes", "tree_rss_bytes", "fds", "processes", "workspaces"):
        values = [getattr(r, name) for r in (report.start, report.peak, report.end)]
        shown = [mib(v) if name.endswith("bytes") else str(v) for v in values]
        lines.append(f"    {name:<14} {shown[0]:>10} {shown[1]:>11} {shown[2]:>11}")
    lines.append(
        f"  growth start->end: {report.growth} -> {'bounded' if report.bounded else 'NOT BOUNDED'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout-seconds", type=float, default=0.3, help="of the slow kind")
    parser.add_argument("--json", type=Path, help="also write the report here as JSON")
    args = parser.parse_args(argv)
    report = run_soak(args.requests, args.clients, args.workers, args.timeout_seconds)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
