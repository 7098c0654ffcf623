"""Threads a program leaves running (SERVER §8, EXTENSIONS §11).

A thread that outlives its program would run on in the worker after the GPU lease is
released: on a reused worker (a session's, or ``--max-requests-per-worker`` above 1) it
could launch GPU work while another program holds the GPU, or read the next program's
data. A thread cannot be killed from outside, so the worker refuses it the only way it can:
at the program's end (under the lease) each thread started during the program gets a short
grace to finish; one still alive after it fails the program and retires the worker, whose
exit ends the thread (leftover processes are killed instead: ``reaper``).

Only Python threads are seen (``threading``): native threads a library starts for itself
(thread pools of BLAS, OpenMP, CUDA) are the library's, not the program's.
"""

from __future__ import annotations

import asyncio
import threading
import time

#: how long threads started by a program may take to finish after it (they may be ending)
THREAD_GRACE_SECONDS = 2.0


def live_threads() -> frozenset[threading.Thread]:
    """The Python threads alive now (taken when a program starts)."""
    return frozenset(threading.enumerate())


def leftover_threads(
    before: frozenset[threading.Thread],
    loop: asyncio.AbstractEventLoop | None = None,
    grace: float = THREAD_GRACE_SECONDS,
) -> list[str]:
    """Names of the threads started since ``before`` still alive after ``grace`` seconds.

    The idle threads of ``loop``'s default executor (``asyncio.to_thread``) are the loop's,
    not leftovers: the executor is let go (its threads end once idle; the loop makes a new
    one when asked), and a thread of it still busy after the grace counts like any other.
    """
    if loop is not None:
        executor = getattr(loop, "_default_executor", None)
        if executor is not None:
            loop._default_executor = None  # type: ignore[attr-defined]
            executor.shutdown(wait=False)
    deadline = time.monotonic() + grace
    current = threading.current_thread()
    started = [
        thread
        for thread in threading.enumerate()
        # a foreign (native) thread that touched ``threading`` is a library's, and unjoinable
        if thread not in before
        and thread is not current
        and not isinstance(thread, threading._DummyThread)  # type: ignore[attr-defined]
    ]
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sorted(thread.name for thread in started if thread.is_alive())


def thread_message(names: list[str]) -> str:
    """The ``runtime`` error of a program that left threads running."""
    listed = ", ".join(repr(name) for name in names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return (
        f"program left threads running after it ended ({listed}{more}); "
        "the worker was retired to stop them"
    )
