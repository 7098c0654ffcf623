"""A router's ``GET /metrics``, its own series: the time one scrape holds the router's event
loop with 256 busy nodes, written now (``RouterMetrics.exposition``: the per-node series
from line heads kept per node, ``kcoral_server.metrics.node_lines``) against every sample
collected and written by prometheus-client at the scrape (``whole_exposition``, as before),
alternating in one run, on the same state. The texts are checked equal first.

    python benchmarks/router_own_scrape.py [--nodes 256] [--requests 50000] [--blocks 10]

A real router state (``build_state``: its registry and log, the metrics listening to it)
holds ``--nodes`` fake node statuses (ready, 8 workers, 4 kinds), and ``--requests``
``request_finished`` lines go through its log, spread over the nodes with exponential queue
waits and durations, and more between scrapes, so every node changes from one scrape to
the next (as for Prometheus's scrape every 15 s of a busy fleet). The handler writes the
text on the loop, so the loop is held as long as ``exposition`` takes. Prints the median
and best per scrape both ways and their ratio; then the same through the router's real HTTP
app in this loop (``GET /metrics`` from a thread): the longest a 1 ms timer on the loop
waited during each scrape, the answer's writing included. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import statistics
import time
import urllib.request
from collections.abc import Callable

import tornado.httpserver
import tornado.netutil
from kcoral_server.metrics.router_metrics import RouterMetrics
from kcoral_server.router.http_app import RouterState, make_app
from kcoral_server.router.log import RouterLog
from kcoral_server.router.main import build_state
from kcoral_server.router.nodes.registry import READY, NodeRecord
from kcoral_server.router.settings import parse_router_args


def busy_router(nodes: int) -> tuple[Callable[[int], None], RouterMetrics, RouterState]:
    """A router state with ``nodes`` ready nodes, and a function that finishes that many
    requests through its log."""
    state = build_state(parse_router_args(["--port", "0"]), RouterLog(io.StringIO()))
    for n in range(nodes):
        node_id = f"gpu-node-{n:03d}"
        state.registry.nodes[node_id] = NodeRecord(
            node_id, state=READY, kind=f"h{n % 4}", worker_count=8, busy_workers=n % 9,
            connected=True,
        )  # fmt: skip
    rng = random.Random(7)

    def finish(count: int) -> None:
        for _ in range(count):
            state.log.event(
                "request_finished",
                path="/execute",
                http_status=200,
                finish_reason=rng.choice(("ok", "ok", "ok", "tunnel_disconnected")),
                node=f"gpu-node-{rng.randrange(nodes):03d}",
                queue_wait_ms=rng.expovariate(1 / 200),
                duration_ms=rng.expovariate(1 / 50),
            )

    return finish, state.metrics, state


def fetch(url: str) -> int:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return len(answer.read())


async def http_stalls(state: RouterState, finish: Callable[[int], None], blocks: int) -> None:
    """GET /metrics of the router's real HTTP app in this loop, from a thread: the longest
    the loop kept a 1 ms timer waiting during each scrape, both ways, alternating."""
    server = tornado.httpserver.HTTPServer(make_app(state))
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/metrics"
    metrics, loop = state.metrics, asyncio.get_running_loop()
    ways = {"before": metrics.whole_exposition, "now": metrics.exposition}
    stalls: dict[str, list[float]] = {"before": [], "now": []}
    for block in range(blocks):
        for name in ("before", "now") if block % 2 else ("now", "before"):
            finish(2 * len(state.registry.nodes))
            metrics.exposition = ways[name]  # type: ignore[method-assign]
            answer, worst = loop.run_in_executor(None, fetch, url), 0.0
            while not answer.done():
                start = time.perf_counter()
                await asyncio.sleep(0.001)
                worst = max(worst, time.perf_counter() - start - 0.001)
            await answer
            stalls[name].append(worst)
    metrics.exposition = ways["now"]  # type: ignore[method-assign]
    server.stop()
    before, now = (statistics.median(stalls[name]) for name in ("before", "now"))
    print(f"GET /metrics over HTTP, the loop's longest stall a scrape (median): "
          f"{before * 1000:.1f} ms -> {now * 1000:.1f} ms, {before / now:.1f}x less")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--requests", type=int, default=50000)
    parser.add_argument("--blocks", type=int, default=10)
    args = parser.parse_args()
    finish, metrics, state = busy_router(args.nodes)
    finish(args.requests)
    now_text, before_text = metrics.exposition(), metrics.whole_exposition()
    assert now_text == before_text, "the two texts differ"
    lines = now_text.count(b"\n")
    print(f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print(f"{args.nodes} nodes, {lines} lines, {len(now_text)} bytes a scrape")
    times: dict[str, list[float]] = {"before": [], "now": []}
    ways = {"before": metrics.whole_exposition, "now": metrics.exposition}
    for block in range(args.blocks):
        for name in ("before", "now") if block % 2 else ("now", "before"):
            finish(2 * args.nodes)  # every node changes between scrapes
            start = time.perf_counter()
            ways[name]()
            times[name].append(time.perf_counter() - start)
    before, now = (statistics.median(times[name]) for name in ("before", "now"))
    print(f"{'':>6} | {'median':>8} | {'best':>8}")
    for name in ("before", "now"):
        print(f"{name:>6} | {statistics.median(times[name]) * 1000:>6.1f}ms | "
              f"{min(times[name]) * 1000:>6.1f}ms")  # fmt: skip
    print(f"loop held per scrape: {before * 1000:.1f} ms -> {now * 1000:.1f} ms, "
          f"{before / now:.1f}x less")  # fmt: skip
    asyncio.run(http_stalls(state, finish, args.blocks))
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
