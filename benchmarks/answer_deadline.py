"""The client's answer deadlines (``kcoral.connection.answer_deadline``) on its hot path: a
small program's ``execute`` and a ``health()`` status read against a local CPU server it
starts (``upload_streaming.start_server``: one reused worker, no sandbox), each request's
deadline kept by the watcher thread (now) against the same transport with its deadlines
left unwatched (baseline: no heap push, no watcher, the cost before 773ee49 plus a few
attribute sets), alternating blocks (each first in turn) in one run.

Rows: wall and client CPU (``time.process_time``, every thread of the client) per request,
medians of the blocks and the ratio now / baseline, and the watcher thread's wake-ups per
100 requests (its voluntary context switches, from ``/proc``): a deadline that ends before
its time must not wake it (de84f2d: it woke twice a request).

    python benchmarks/answer_deadline.py [--requests 200] [--blocks 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from upload_streaming import start_server

from kcoral import Client, Program
from kcoral.connection import http
from kcoral.connection.answer_deadline import AnswerDeadline

WATCHER_THREAD = "kcoral-answer-deadlines"


@contextmanager
def unwatched() -> Iterator[None]:
    """Deadlines made as usual but never handed to the watcher (the baseline)."""
    watched = http.watched
    http.watched = AnswerDeadline
    try:
        yield
    finally:
        http.watched = watched


def watcher_switches() -> int:
    """The watcher thread's voluntary context switches so far (0 before it started)."""
    for thread in threading.enumerate():
        if thread.name == WATCHER_THREAD and thread.native_id is not None:
            with open(f"/proc/self/task/{thread.native_id}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        return int(line.split()[1])
    return 0


def measured(call: Callable[[], object], requests: int, baseline: bool) -> dict[str, float]:
    """Wall and CPU microseconds per request, and watcher wake-ups per 100 requests."""
    with unwatched() if baseline else nullcontext():
        switches = watcher_switches()
        cpu = time.process_time()
        wall = time.perf_counter()
        for _ in range(requests):
            call()
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        switches = watcher_switches() - switches
    return {
        "wall": wall / requests * 1e6,
        "cpu": cpu / requests * 1e6,
        "wake-ups": switches * 100 / requests,
    }


def alternated(name: str, call: Callable[[], object], requests: int, blocks: int) -> None:
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(3):
        call()  # warm: connection, worker, module cache, the watcher thread
    for block in range(blocks):
        for baseline in (True, False) if block % 2 else (False, True):
            runs[baseline].append(measured(call, requests, baseline))
    for row, unit in (("wall", "us"), ("cpu", "us"), ("wake-ups", "per 100")):
        before = statistics.median(run[row] for run in runs[True])
        now = statistics.median(run[row] for run in runs[False])
        ratio = f", ratio {now / before:.3f}" if before else ""
        print(f"{name}, {row}: baseline {before:.1f} {unit}, now {now:.1f} {unit}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=10)
    options = parser.parse_args()
    program = Program()
    module = program.upload(kind="module", source="def f():\n    return 1\n")
    program.return_(key="x", value=program.run(fn=program.get_function(module=module, name="f")))
    with tempfile.TemporaryDirectory() as scratch:
        server, url = start_server(scratch)
        try:
            with Client(url) as client:
                trip = lambda: client.execute(program)  # noqa: E731
                alternated("small program execute", trip, options.requests, options.blocks)
                alternated("health()", client.health, options.requests, options.blocks)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
