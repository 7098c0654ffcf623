"""A router's ``GET /metrics`` with its nodes' own series (``kcoral_server.metrics.node_relay``):
the time the router's event loop spends on one scrape, with the nodes' sample lines written
when their texts came (``NodeRelay.text``, now) against writing every sample at the scrape
(``collect`` through prometheus-client's writer, as before), in one run.

    python benchmarks/router_scrape.py [--nodes 8 32 128] [--samples 2048]

Each node sends ``--samples`` samples (2048 is the most a node may; an 8-GPU server exports
about 650). Prints each fleet's scrape time both ways and their ratio, and the time a node's
text costs to write when it comes (off the loop, once per text and at most every 5 s per
node). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import time

from kcoral_server.metrics.node_relay import LiveNode, NodeRelay, parse_and_write
from prometheus_client import generate_latest

# one histogram family per GPU and endpoint-like label, as a busy 8-GPU server's
BUCKET_BOUNDS = ("0.001", "0.01", "0.1", "1", "10", "60", "600", "+Inf")


def node_text(samples: int) -> bytes:
    lines = ["# TYPE kcoral_lease_wait_seconds histogram"]
    gpu = 0
    while len(lines) - 1 < samples:
        for bound in BUCKET_BOUNDS:
            lines.append(f'kcoral_lease_wait_seconds_bucket{{gpu="{gpu}",le="{bound}"}} 7')
        lines.append(f'kcoral_lease_wait_seconds_count{{gpu="{gpu}"}} 7')
        lines.append(f'kcoral_lease_wait_seconds_sum{{gpu="{gpu}"}} 1.5')
        gpu += 1
    return ("\n".join(lines[: samples + 1]) + "\n").encode()


class Before:
    """The scrape before: every sample written at the scrape, by prometheus-client."""

    def __init__(self, relay: NodeRelay, live: list[LiveNode]) -> None:
        self.relay, self.live = relay, live

    def collect(self):
        return self.relay.collect(self.live)


def best_of(repeats: int, run) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--samples", type=int, default=2048)
    args = parser.parse_args()
    text = node_text(args.samples)
    print(f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'nodes':>5} | {'samples':>7} | {'before':>9} | {'now':>8} | ratio | a text written")
    for count in args.nodes:
        relay, live, written = NodeRelay(), [], []
        ids = [f"node{n}" for n in range(count)]
        for node_id in ids:
            start = time.perf_counter()
            families, lines = parse_and_write(text, node_id, "h100")
            written.append(time.perf_counter() - start)
            relay.keep(node_id, "i", families, 0.0, ids, lines)
            live.append(LiveNode(node_id, "i", node_id, "h100"))

        repeats = 3 if count > 32 else 10
        before = best_of(repeats, lambda r=relay, n=live: generate_latest(Before(r, n)))
        now = best_of(repeats, lambda r=relay, n=live: r.text(n))
        print(
            f"{count:>5} | {relay.samples:>7} | {before * 1000:>7.1f}ms | {now * 1000:>6.2f}ms | "
            f"{before / now:>4.0f}x | {min(written) * 1000:.1f} ms (parse included)"
        )
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
