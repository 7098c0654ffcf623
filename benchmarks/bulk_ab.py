"""Alternating A/B rounds of the three bulk measures of ``perf.py`` over source trees.

    python benchmarks/bulk_ab.py [--rounds N] [--samples K] NAME=DIR [NAME=DIR ...]
    python benchmarks/bulk_ab.py --snapshot DIR COMMIT   # DIR: COMMIT's kcoral + kcoral_server

Each DIR holds the ``kcoral`` and ``server`` folders of a commit (``--snapshot`` makes one
with ``git archive``); a round runs every tree once, in alternating order, each in a child
process with ``PYTHONPATH=DIR/server:DIR`` (``tree_path``) that starts its own reused-worker
server (as ``perf.py`` does; its workers inherit the path) and measures ``bytes_cold``,
``bytes_warm`` and ``tensor_cold`` at 64 MiB. Reported per tree: wall medians and their
ratio to the floor measured in the same child, and CPU time per request of the client, the
front-end and the server's whole process tree (front-end + workers): on a loaded machine CPU
time moves far less than wall time, so it is what tells the trees apart there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
MEASURES = ("cold", "warm", "tensor")


def one_round(samples: int) -> dict[str, float | str]:
    """The child: one server, the three measures, CPU per request, the floors."""
    sys.path.insert(0, str(HERE))
    import perf_baselines as base
    import perf_kcoral as kc
    import psutil

    import kcoral

    size = 64 * MIB
    args = ["--num-workers", "2", "--max-requests-per-worker", "0"]
    args += ["--cache-capacity-bytes", str(1024 * MIB)]

    out: dict[str, float | str] = {}
    runs = {"cold": kc.bytes_cold, "warm": kc.bytes_warm, "tensor": kc.tensor_cold}
    with kc.kcoral_server(args) as server, kcoral.Client(server.url) as client:
        kc.warm_up_workers(server.url, 2)
        kc.bytes_cold(client, size, 1)
        kc.tensor_cold(client, size, 1)
        front = psutil.Process(server.pid)
        tree = [front, *front.children(recursive=True)]
        me = psutil.Process()
        cpu = kc.cpu_seconds
        for name, run in runs.items():
            before = cpu(tree), cpu([front]), cpu([me])
            times = run(client, size, samples)
            requests = samples + (name == "warm")  # bytes_warm caches its blob first
            out[f"{name}_ms"] = statistics.median(times) * 1e3
            out[f"{name}_server_cpu_ms"] = (cpu(tree) - before[0]) / requests * 1e3
            out[f"{name}_front_cpu_ms"] = (cpu([front]) - before[1]) / requests * 1e3
            out[f"{name}_client_cpu_ms"] = (cpu([me]) - before[2]) / requests * 1e3
    tcp = base.loopback_tcp_seconds_per_byte(size, 3)
    sha = base.sha256_seconds_per_byte(size, 3)
    floors = {"cold": 2 * tcp + 4 * sha, "warm": tcp + 2 * sha, "tensor": 2 * tcp + 4 * sha}
    for name in MEASURES:
        out[name] = float(out[f"{name}_ms"]) / (floors[name] * size * 1e3)
    out["load"] = os.getloadavg()[0]
    out["kcoral"] = kcoral.__file__
    return out


def tree_path(directory: str) -> str:
    """The ``PYTHONPATH`` that imports ``kcoral`` and ``kcoral_server`` from a snapshot."""
    return f"{Path(directory) / 'server'}{os.pathsep}{directory}"


def snapshot(directory: Path, commit: str) -> None:
    """``commit``'s ``kcoral`` and ``server`` folders in ``directory`` (``tree_path``)."""
    directory.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit, "kcoral", "server"], cwd=HERE.parent, capture_output=True,
        check=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--snapshot", nargs=2, metavar=("DIR", "COMMIT"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("trees", nargs="*", metavar="NAME=DIR")
    args = parser.parse_args(argv)
    if args.snapshot:
        snapshot(Path(args.snapshot[0]), args.snapshot[1])
        return 0
    if args.child:
        print(json.dumps(one_round(args.samples)))
        return 0
    trees = [tree.split("=", 1) for tree in args.trees]
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for round_index in range(args.rounds):
        for name, directory in trees if round_index % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": tree_path(directory)}
            command = [sys.executable, __file__, "--child", "--samples", str(args.samples)]
            child = subprocess.run(command, env=env, capture_output=True, text=True)
            if child.returncode:
                print(f"{round_index} {name} failed:\n{child.stderr[-2000:]}", flush=True)
                continue
            row = json.loads(child.stdout.strip().splitlines()[-1])
            results[name].append(row)
            print(round_index, name, json.dumps(row), flush=True)
    for name, rows in results.items():
        if rows:
            keys = sorted(key for key in rows[0] if key != "kcoral")
            medians = {key: round(statistics.median(row[key] for row in rows), 3) for key in keys}
            print(name, "median of", len(rows), json.dumps(medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
