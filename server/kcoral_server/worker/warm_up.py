"""A one-shot worker's warm-up, while it waits for its program (issue 31).

A forked worker shares its memory with the fork server until it writes to it: the first
write to each page copies it (a page fault, ~3-6 us in a VM). Even a trivial first program
writes to ~500 such pages (reference counts of the objects its code paths touch, the type
cache, the allocator's pools), ~2 ms of the request's round trip. A spare worker that is
left waiting for its program (``IDLE_BEFORE_WARM_UP_SECONDS`` after it reported ready: a
notebook's next cell) runs the pure parts of that path once on a program of its own:
parsing and checking a program, compiling and calling a Python function, encoding a return
value and the worker's messages. A spare whose program comes sooner (requests back to back)
skips it: there the machine is busy, and copying those pages ahead would only add ~1 ms of
CPU per worker that the running program and the next spare's start need; a program that
arrives during the warm-up stops it between steps.

Nothing of it stays: no module is registered, no file or descriptor is touched, nothing is
sent, and the program's own names (``kcoral_uploaded_<pid>_1``, ``linecache``) are not used.

Who can reach what: nothing here reads anything a program or the front-end sent; the
warm-up program is a constant.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from kcoral_server.processes.ipc import ProgramFinished, ReturnProduced, encode
from kcoral_server.worker.modules import uploaded_filename

_SOURCE = "def answer(x):\n    return x + 1\n"
_PROGRAM = json.dumps(
    {
        "instructions": [
            {"op": "upload", "kind": "module", "id": "m", "source": _SOURCE},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "answer"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [41]},
            {"op": "return", "key": "answer", "value": {"$ref": "r"}},
        ]
    }
)


#: how long a spare waits for its program before it warms up: longer than the gap between
#: its ready and its program when requests come back to back (a few ms on two cores),
#: far shorter than a person's pause between cells
IDLE_BEFORE_WARM_UP_SECONDS = 0.02

#: when this process began to warm up (monotonic), None: it did not
warmed_up_at: float | None = None


def _never() -> bool:
    return False


def warm_up(stop: Callable[[], bool] = _never) -> Any:
    """Run the pure parts of a trivial program's path once; returns the encoded answer
    (42's node), or None when ``stop()`` said so between two steps (the program came).
    Any failure is the warm-up's only: the worker runs its program anyway."""
    global warmed_up_at
    warmed_up_at = time.monotonic()
    return _run_path(stop)


def warm_up_for_forks() -> bool:
    """The fork server's warm-up, once, before it freezes its heap: what the path makes
    once (code specialized on its first runs, the type and method caches, the allocator's
    pools) is then made for every worker it forks, which copies ~60-70 fewer pages on its
    first program's round trip. Leaves ``warmed_up_at`` alone: that says whether the
    worker itself warmed up. False when it failed: the workers then run that path cold."""
    try:
        return _run_path(_never) is not None
    except Exception:
        return False


def _run_path(stop: Callable[[], bool]) -> Any:
    from kcoral.protocol.values import fill_part_hashes
    from kcoral_server.worker.engine import _parse
    from kcoral_server.worker.instructions import _encode

    _parse(_PROGRAM)
    uploaded_filename(_SOURCE)
    if stop():
        return None
    namespace: dict[str, Any] = {"__builtins__": __builtins__}
    exec(compile(_SOURCE, "<kcoral warm-up>", "exec", dont_inherit=True), namespace)
    # the return step's own encoder; 42 is far inside any response budget
    node, _parts = _encode(namespace["answer"](41), 0, budget=1 << 20)
    if stop():
        return None
    fill_part_hashes(node, 0, [])
    encode(ReturnProduced(index=3, key="answer", node=node, part_lengths=[]))
    encode(ProgramFinished(status="COMPLETED"))
    return node
