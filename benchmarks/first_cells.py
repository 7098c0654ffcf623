"""A notebook's first cells after its server started: each one's round trip, against the
same server's steady cell, optionally A/B over source trees.

    python benchmarks/first_cells.py [--rounds N] [--cells K] [--gap S] [--first-after S]
    python benchmarks/first_cells.py --rounds 4 base=DIR head=DIR  # bulk_ab.py --snapshot

Each round starts ``kcoral server`` with its default flags (sandbox, torch preloaded in the
fork servers, one fresh worker per program; a token, as the README starts one), sends
``--first-after`` seconds after it is ready (0: at once; a person opening a notebook takes
longer) ``--cells`` programs that multiply a small tensor with torch, ``--gap``
seconds apart (a person running cells one after another), then ``--steady`` more: their
median is the baseline the first cells are compared with, measured in the same minutes on
the same server. Reported per cell: the median round trip over rounds and its ratio to
the steady cell, and the time from the server's start to its ready file. With trees, each
round runs every tree once (order alternating), the server from the tree's source
(``PYTHONPATH``), and a last column gives each tree's ratio to the first one's.
Nothing is asserted: the numbers are the machine's.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = """
import torch
def scale(values, factor):
    return (torch.tensor(values) * factor).tolist()
"""


def one_cell(url: str, token: str) -> float:
    """One program's round trip (seconds): a torch import at the worker's first use."""
    import kcoral

    program = kcoral.Program()
    module = program.upload(kind="module", source=SOURCE)
    scale = program.get_function(module=module, name="scale")
    program.return_(key="out", value=program.run(fn=scale, args=[[1.0, 2.0, 3.0], 2.5]))
    started = time.perf_counter()
    with kcoral.Client(url, token=token) as client:
        result = client.execute(program, timeout_seconds=120)
    elapsed = time.perf_counter() - started
    if result["out"] != [2.5, 5.0, 7.5]:
        raise RuntimeError(f"wrong answer: {result['out']!r}")
    return elapsed


def one_round(
    python_path: str, cells: int, gap: float, steady: int, first_after: float = 0.0
) -> dict[str, list[float]]:
    """A fresh server from ``python_path``: its ready time, first cells and steady cells."""
    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="kcoral-first-cells-") as folder:
        ready = Path(folder) / "url"
        env = {**os.environ, "PYTHONPATH": python_path, "KCORAL_AUTH_TOKEN": token}
        env.pop("KCORAL_WORKER_PRELOAD", None)  # the default: torch
        command = [sys.executable, "-m", "kcoral", "server", "--port", "0"]
        command += ["--ready-file", str(ready), "--log-dir", str(Path(folder) / "logs")]
        command += ["--disk-cache-dir", str(Path(folder) / "cache")]
        started = time.perf_counter()
        with open(Path(folder) / "server.log", "wb") as log:
            server = subprocess.Popen(command, env=env, stderr=log, cwd=folder)
        try:
            while not ready.exists() or not ready.read_text().strip():
                if server.poll() is not None or time.perf_counter() - started > 120:
                    log_tail = (Path(folder) / "server.log").read_text(errors="replace")
                    raise RuntimeError(f"the server did not start:\n{log_tail[-2000:]}")
                time.sleep(0.01)
            ready_seconds = time.perf_counter() - started
            url = ready.read_text().strip()
            time.sleep(first_after)
            first = []
            for _ in range(cells):
                first.append(one_cell(url, token))
                time.sleep(gap)
            rest = [one_cell(url, token) for _ in range(steady)]
        finally:
            server.terminate()
            server.wait(60)
    return {"ready": [ready_seconds], "first": first, "steady": [statistics.median(rest)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cells", type=int, default=4, help="first cells timed one by one")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between first cells")
    parser.add_argument("--steady", type=int, default=10, help="cells for the baseline")
    parser.add_argument(
        "--first-after", type=float, default=0.0, help="seconds from ready to the first cell"
    )
    parser.add_argument("trees", nargs="*", metavar="NAME=DIR")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.cells < 1 or args.steady < 1 or min(args.gap, args.first_after) < 0:
        parser.error(
            "--rounds, --cells and --steady must be at least 1, --gap and --first-after not "
            "negative"
        )
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bulk_ab import tree_path

    trees = [(name, tree_path(folder)) for name, folder in (t.split("=", 1) for t in args.trees)]
    if not trees:
        trees = [("this tree", f"{REPO / 'server'}{os.pathsep}{REPO}")]
    load = os.getloadavg()[0]
    rounds: dict[str, list[dict[str, list[float]]]] = {name: [] for name, _ in trees}
    for index in range(args.rounds):
        for name, path in trees if index % 2 == 0 else trees[::-1]:
            row = one_round(path, args.cells, args.gap, args.steady, args.first_after)
            rounds[name].append(row)
            shown = " ".join(f"{seconds * 1e3:.0f}" for seconds in row["first"])
            print(f"round {index} {name}: first cells {shown} ms, steady "
                  f"{row['steady'][0] * 1e3:.1f} ms", flush=True)  # fmt: skip
    print(f"\nload average {load:.2f} -> {os.getloadavg()[0]:.2f}; medians over rounds")
    reference = trees[0][0]
    columns = ["cell", *(f"{name} ms (÷ steady)" for name, _ in trees)]
    columns += [f"{name} ÷ {reference}" for name, _ in trees[1:]]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")

    def median(name: str, key: str, at: int = 0) -> float:
        return statistics.median(row[key][at] for row in rounds[name])

    rows = [(f"{k + 1}", "first", k) for k in range(args.cells)] + [("steady", "steady", 0)]
    for label, key, at in rows:
        cells = []
        for name, _ in trees:
            value, steady = median(name, key, at), median(name, "steady")
            cells.append(f"{value * 1e3:.1f} ({value / steady:.1f}×)")
        ratios = [median(name, key, at) / median(reference, key, at) for name, _ in trees[1:]]
        print(f"| {label} | " + " | ".join(cells + [f"{r:.3g}×" for r in ratios]) + " |")
    ready = " / ".join(f"{name} {median(name, 'ready'):.2f} s" for name, _ in trees)
    print(f"\nserver start to ready (median): {ready}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
