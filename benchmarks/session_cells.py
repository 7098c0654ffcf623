"""A session cell through the ``%%kcoral`` magic against the same program through the client.

    python benchmarks/session_cells.py [--url URL] [--cells N] [--import-module NAME] [--quick]

Without ``--url`` a private CPU server is started (and stopped) for the run. An in-process
IPython shell loads the extension, connects to the server and starts a session
(``%kcoral session start``); the client side opens its own session with
``client.session()``. Rows (medians):

* the queue time of the cell right after one that imported ``--import-module`` (default
  ``torch`` when importable, else ``asyncio``), as a session's first cell does: the worker's
  clean-up after such a program used to make the next one wait up to a second (issue 29.9);
* a trivial session cell through the magic (``%%kcoral --quiet``: wall and queue);
* the same program (``cell_program.build_cell`` of the same source, in the session's
  namespace) through ``Session.execute``: wall and queue, and the magic's ratio to it.

Nothing is asserted: the numbers are the machine's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kcoral

TRIVIAL_CELL = "value = 41 + 1\n"


@contextmanager
def private_server() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as base:
        ready = Path(base) / "ready"
        command = [
            sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0",
            "--ready-file", str(ready), "--sandbox", "none", "--log-dir", "",
            "--no-log-console", "--disk-cache-dir", os.path.join(base, "disk"),
        ]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not ready.exists() or not ready.read_text().strip():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the benchmark server did not start")
                time.sleep(0.05)
            yield ready.read_text().strip()
        finally:
            process.terminate()
            process.wait(60)


def timed(call: Callable[[], kcoral.ProgramResult], cells: int) -> tuple[float, float]:
    """Median wall and queue milliseconds of ``cells`` calls (after two warm-ups)."""
    for _ in range(2):
        call()
    walls, queues = [], []
    for _ in range(cells):
        started = time.perf_counter()
        result = call()
        walls.append((time.perf_counter() - started) * 1000)
        queues.append(result.queue_ms)
    return statistics.median(walls), statistics.median(queues)


def magic_shell(url: str) -> Any:
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kcoral_jupyter")
    shell.run_line_magic("kcoral", f"connect {url}")
    shell.run_line_magic("kcoral", "session start")
    return shell


def magic_cell(shell: Any, source: str) -> kcoral.ProgramResult:
    outcome = shell.run_cell("%%kcoral --quiet\n" + source)
    if outcome.error_in_exec is not None:
        raise outcome.error_in_exec
    return shell.user_ns["_kcoral"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use this server instead of starting one")
    parser.add_argument("--cells", type=int, default=30)
    default_module = "torch" if importlib.util.find_spec("torch") else "asyncio"
    parser.add_argument("--import-module", default=default_module)
    parser.add_argument("--quick", action="store_true", help="few cells (a smoke test)")
    args = parser.parse_args(argv)
    cells = 3 if args.quick else args.cells
    with contextlib.nullcontext(args.url) if args.url else private_server() as url:
        return run(url, cells, args.import_module)


def run(url: str, cells: int, import_module: str) -> int:
    from kcoral_jupyter.cell_program import CellSpec, build_cell

    shell = magic_shell(url)
    try:
        magic_cell(shell, f"import {import_module}\n")
        after_import = magic_cell(shell, TRIVIAL_CELL).queue_ms
        magic_wall, magic_queue = timed(lambda: magic_cell(shell, TRIVIAL_CELL), cells)
    finally:
        shell.run_line_magic("kcoral", "session stop")
    built = build_cell(CellSpec(source=TRIVIAL_CELL, in_session=True))
    with kcoral.Client(url) as client, client.session() as session:
        session.execute(build_cell(CellSpec(source=f"import {import_module}\n")).program)
        client_wall, client_queue = timed(lambda: session.execute(built.program), cells)
    rows = [
        (f"session cell after `import {import_module}`: queue", f"{after_import:.1f} ms"),
        ("session cell through %%kcoral: wall", f"{magic_wall:.1f} ms"),
        ("session cell through %%kcoral: queue", f"{magic_queue:.1f} ms"),
        ("same program through Session.execute: wall", f"{client_wall:.1f} ms"),
        ("same program through Session.execute: queue", f"{client_queue:.1f} ms"),
        ("magic / client (wall)", f"{magic_wall / client_wall:.2f}x"),
    ]
    print(f"{cells} cells each, median; server {url}")
    for name, value in rows:
        print(f"{name:<52}{value:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
