"""Router overhead: trivial-program latency and 64 MiB throughput, routed vs direct.

Starts a direct CPU server, a router and one CPU node on loopback, then prints ratios
measured in the same run (targets: latency <= 1.5 x direct + 1 ms, throughput >= 0.7 x
direct). ``--grpc-port`` runs the router with gRPC on its own port instead of the shared one.

    python benchmarks/router.py [--requests 200] [--mib 64] [--rounds 5] [--grpc-port]
                                [--clients 16] [--workers 4] [--upload-only] [--quick]

It also measures trivial requests/s with concurrent clients, direct and routed, and the
router's own CPU time per forwarded request (its forwarding capacity per core), and the
router's CPU time per MiB of upload. ``--upload-only`` measures just the upload (for A/B runs
of the bulk path); ``--quick`` is a smoke run (20 requests, 2 rounds of 16 MiB, 4 clients).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kcoral

ROOT = Path(__file__).resolve().parents[1]
MODULE = (
    "import hashlib\ndef one():\n    return 1\n"
    "def digest(b):\n    return hashlib.sha256(b).hexdigest()\n"
)
SERVER_ARGS = ["--device", "cpu", "--port", "0", "--sandbox", "none", "--log-dir", "",
               "--max-requests-per-worker", "0", "--no-log-console"]  # fmt: skip


def wait_file(path: Path, process: subprocess.Popen, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited")
        time.sleep(0.05)
    raise RuntimeError(f"{process.args} did not start")


def node_command() -> list[str]:
    return [sys.executable, "-m", "kcoral", "server"]


def program(name: str, blob: bytes | None = None) -> kcoral.Program:
    p = kcoral.Program()
    fn = p.get_function(module=p.upload(kind="module", source=MODULE), name=name)
    args = [] if blob is None else [p.upload(kind="bytes", value=blob)]
    p.return_(key="out", value=p.run(fn=fn, args=args))
    return p


def latency_ms(url: str, count: int) -> float:
    trivial = program("one")
    with kcoral.Client(url) as client:
        for _ in range(10):
            client.execute(trivial)  # warm caches and connections
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            client.execute(trivial)
            samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def upload_rates(direct_url: str, router_url: str, mib: int, rounds: int, router_pid: int):
    """Median MiB/s direct and routed, rounds interleaved (so load changes hit both alike),
    and the router's CPU milliseconds per routed MiB."""
    rates: dict[str, list[float]] = {direct_url: [], router_url: []}
    router_cpu = 0.0
    with kcoral.Client(direct_url) as direct, kcoral.Client(router_url) as routed:
        for client in (direct, routed):
            for _ in range(4):  # warm connections, workers and the module cache
                client.execute(program("digest", b"warm"))
        for _ in range(rounds):
            for url, client in ((direct_url, direct), (router_url, routed)):
                blob = os.urandom(mib << 20)  # fresh content: the blob really travels
                cpu_before = cpu_seconds(router_pid)
                start = time.perf_counter()
                client.execute(program("digest", blob))
                rates[url].append(mib / (time.perf_counter() - start))
                if url == router_url:
                    router_cpu += cpu_seconds(router_pid) - cpu_before
    return (
        statistics.median(rates[direct_url]),
        statistics.median(rates[router_url]),
        router_cpu * 1000 / (mib * rounds),
    )


def concurrent_rate(url: str, total: int, clients: int) -> float:
    """Trivial requests per second with ``clients`` concurrent callers (one asyncio loop)."""
    trivial = program("one")

    async def run() -> float:
        async with kcoral.AsyncClient(url) as client:
            for _ in range(clients):
                await client.execute(trivial)  # warm caches and connections
            remaining = iter(range(total))

            async def caller() -> None:
                for _ in remaining:
                    await client.execute(trivial)

            start = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(clients)))
            return total / (time.perf_counter() - start)

    return asyncio.run(run())


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (the router), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--grpc-port", action="store_true")
    parser.add_argument("--clients", type=int, default=16, help="concurrent callers")
    parser.add_argument("--workers", type=int, default=4, help="workers of each server")
    parser.add_argument("--upload-only", action="store_true", help="only the upload ratio")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds, args.mib, args.clients = 20, 2, 16, 4
    tmp = Path(tempfile.mkdtemp(prefix="kcoral-bench-"))
    processes: list[subprocess.Popen] = []
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    try:
        server_args = [*SERVER_ARGS, "--num-workers", str(args.workers)]
        direct = subprocess.Popen(
            [sys.executable, "-m", "kcoral", "server", *server_args,
             "--disk-cache-dir", str(tmp / "c1"), "--ready-file", str(tmp / "direct")], **quiet
        )  # fmt: skip
        processes.append(direct)
        router_args = ["--port", "0", "--ready-file", str(tmp / "router")]
        if args.grpc_port:
            router_args += ["--grpc-port", "0"]
        router_log = open(tmp / "router.log", "w")
        router = subprocess.Popen(
            [sys.executable, "-m", "kcoral", "router", *router_args],
            stdout=subprocess.DEVNULL,
            stderr=router_log,
        )
        processes.append(router)
        router_url = wait_file(tmp / "router", router)
        grpc_url = router_url
        if args.grpc_port:
            deadline = time.monotonic() + 10
            while "grpc=" not in (tmp / "router.log").read_text():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            grpc_url = (tmp / "router.log").read_text().split("grpc=")[1].split()[0]
        node = subprocess.Popen(
            [*node_command(), *server_args, "--router", grpc_url, "--node-id", "bench",
             "--disk-cache-dir", str(tmp / "c2"), "--ready-file", str(tmp / "node")], **quiet
        )  # fmt: skip
        processes.append(node)
        direct_url = wait_file(tmp / "direct", direct)
        wait_file(tmp / "node", node)
        with kcoral.Client(router_url) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.health()["load"]["request_capacity"] >= args.workers:
                        break
                except Exception:
                    pass
                assert time.monotonic() < deadline, "router never became ready"
                time.sleep(0.1)
        if not args.upload_only:
            direct_latency = latency_ms(direct_url, args.requests)
            routed_latency = latency_ms(router_url, args.requests)
        direct_rate, routed_rate, upload_cpu_ms = upload_rates(
            direct_url, router_url, args.mib, args.rounds, router.pid
        )
        if not args.upload_only:
            total = 10 * args.requests
            direct_rps = concurrent_rate(direct_url, total, args.clients)
            cpu_before = cpu_seconds(router.pid)
            routed_rps = concurrent_rate(router_url, total, args.clients)
            router_cpu_ms = (cpu_seconds(router.pid) - cpu_before) * 1000 / total
    finally:
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    mode = "separate --grpc-port" if args.grpc_port else "shared port (HTTP/2 preface demux)"
    print(f"router gRPC listener: {mode}")
    print(f"{args.mib} MiB upload   direct {direct_rate:.0f} MiB/s  "
          f"routed {routed_rate:.0f} MiB/s  "
          f"ratio {routed_rate / direct_rate:.2f}  "
          f"({'ok' if routed_rate >= 0.7 * direct_rate else 'MISSED'})  "
          f"router CPU {upload_cpu_ms:.1f} ms/MiB")  # fmt: skip
    if args.upload_only:
        return 0
    print(f"trivial latency  direct {direct_latency:.2f} ms  routed {routed_latency:.2f} ms  "
          f"ratio {routed_latency / direct_latency:.2f}  "
          f"budget {1.5 * direct_latency + 1:.2f} ms "
          f"({'ok' if routed_latency <= 1.5 * direct_latency + 1 else 'MISSED'})")  # fmt: skip
    print(
        f"{args.clients} concurrent clients, {args.workers} workers: direct {direct_rps:.0f} req/s"
        f"  routed {routed_rps:.0f} req/s  ratio {routed_rps / direct_rps:.2f}"
    )
    print(
        f"router CPU per forwarded trivial request {router_cpu_ms:.2f} ms: one router process "
        f"forwards at most about {1000 / router_cpu_ms:.0f} trivial requests/s per core"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
