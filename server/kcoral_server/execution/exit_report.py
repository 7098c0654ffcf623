"""A one-shot worker's exit code, before its process has gone (SERVER §8; issue 31).

A forked worker ends with ``os._exit``; the kernel then takes ~15 ms to tear down a process
that maps the launcher's torch, and its exit code used to be known only after that. Now,
once its exit handlers ran and its descendants are dead, it sends ``WorkerExiting`` with
the code it is about to exit with, and the answer waits for that frame instead: after it
nothing of the worker can change the answer. What must still wait for the process to be
gone does: its lease, its seat's next program (``Pool``), the kill of what is left of its
tree and the confirmation of that kill, which quarantines its GPUs if it fails.

Who can reach what: the frame comes from the worker, so the program (its atexit handlers
run before it) could send it early, or with a code of its choosing. It can only misreport
its own teardown that way, which it controls anyway; the front-end still finds processes
it left (``StrayWatch``) before believing the frame, and the seat and lease still wait for
the real exit.
"""

from __future__ import annotations

import asyncio

from kcoral_server.processes import ipc
from kcoral_server.processes.channel import ReceiveInterrupted, WorkerGone, close_fds
from kcoral_server.processes.handle import WorkerHandle

__all__ = ["announced_exit"]


async def announced_exit(handle: WorkerHandle, timeout: float) -> int | None:
    """The exit code ``handle``'s worker announced after its program within ``timeout``;
    None when it did not (a spawned worker has no such frame, or it crashed, or took too
    long) or when processes of its are still alive besides it: the caller then awaits the
    exit itself, as before."""
    try:
        message, fds = await handle.channel.receive(max(0.0, timeout))
    except (asyncio.TimeoutError, TimeoutError, WorkerGone, ReceiveInterrupted):
        return None
    close_fds(fds)
    if not isinstance(message, ipc.WorkerExiting):
        return None  # anything else after the outcome: the exit and its code decide
    if handle.strays is not None and handle.strays.find():
        return None  # something still runs: killed and confirmed before the answer
    handle.exit_announced = True  # a CPU seat may hand over now (``SpareWorkers``)
    return message.code
