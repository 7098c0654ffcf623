"""Worker process entry: configure, start, then run programs until told to stop.

Launched by the front-end as ``python -m kcoral_server.worker --fd N`` with its end of an
``AF_UNIX`` socketpair; see ``kcoral_server.processes.ipc`` for the messages.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import socket

from kcoral_server.processes.ipc import (
    SANDBOX_CLEANUP,
    BlockingChannel,
    Configure,
    IpcError,
    RunProgram,
    Shutdown,
    WorkerReady,
    WorkerRetiring,
    WorkerStartFailed,
)
from kcoral_server.processes.limits import apply_memory_rlimit
from kcoral_server.worker.confinement import empty_private_tmp
from kcoral_server.worker.engine import Engine
from kcoral_server.worker.failures import exception_text
from kcoral_server.worker.leasing import Lease, WorkerExit
from kcoral_server.worker.reaper import become_subreaper, kill_descendants
from kcoral_server.worker.runtime import make_runtime
from kcoral_server.worker.state import ProcessSnapshot


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def serve(channel: BlockingChannel) -> int:
    """Run the worker protocol on ``channel``; returns the process exit code."""
    become_subreaper()  # double-forked and setsid descendants stay ours to reap
    try:
        message, fds = channel.receive()
    except EOFError:
        return 0
    _close_all(fds)
    if not isinstance(message, Configure):
        channel.send(WorkerStartFailed(error=f"expected configure, got {message.tag}"))
        return 1
    configure = message
    try:
        runtime = make_runtime(configure)
        lease = Lease(channel, enabled=runtime.uses_lease)
        identity = runtime.start(lease)
        snapshot = ProcessSnapshot()  # the post-start state every program returns to
        engine = Engine(channel, runtime, lease, configure, snapshot)
    except WorkerExit:
        return 0
    except Exception as exc:
        with contextlib.suppress(OSError):
            channel.send(WorkerStartFailed(error=exception_text(exc)))
        return 1
    # Start-up objects (torch's and numpy's included) live as long as the process: keep them
    # out of every later collection (SERVER §6 teardown collects after each program).
    gc.collect()
    gc.freeze()
    ready = WorkerReady(
        pid=os.getpid(),
        target=identity.target,
        versions=identity.versions,
        device_uuid=identity.device_uuid,
    )
    channel.send(ready)
    while True:
        try:
            message, fds = channel.receive()
        except EOFError:
            return 0
        if isinstance(message, Shutdown):
            _close_all(fds)
            return 0
        if not isinstance(message, RunProgram):
            _close_all(fds)
            raise IpcError(f"unexpected message {message.tag} between programs")
        try:
            outcome = engine.run(message, fds)
        except WorkerExit:
            return 0
        channel.send(outcome.message())
        if configure.transient:
            return 0  # exits at once: nothing to clean for a next program
        if outcome.poisoned:
            continue  # no WorkerReady: the front-end retires it (Shutdown, or its end)
        if not engine.settle():  # the slow clean-up, after the outcome, before ready again
            channel.send(WorkerRetiring(reason=SANDBOX_CLEANUP))
            return 0
        channel.send(ready)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kcoral_server.worker")
    parser.add_argument("--fd", type=int, required=True, help="the worker's socketpair end")
    args = parser.parse_args(argv)
    apply_memory_rlimit()  # before anything big is imported or allocated
    empty_private_tmp()  # a sandbox's private /tmp holds what the seat's last worker left
    sock = socket.socket(fileno=args.fd)
    channel = BlockingChannel(sock)
    try:
        return serve(channel)
    except (OSError, IpcError):
        return 1  # the front-end is gone or speaks nonsense: nothing left to report to
    finally:
        kill_descendants()
        with contextlib.suppress(OSError):
            sock.close()
