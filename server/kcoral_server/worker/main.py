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
import sys

from kcoral_server.processes.ipc import (
    SANDBOX_CLEANUP,
    BlockingChannel,
    Configure,
    IpcError,
    RunProgram,
    Shutdown,
    WorkerExiting,
    WorkerReady,
    WorkerRetiring,
    WorkerStartFailed,
)
from kcoral_server.processes.launcher.finalizers import skip_idle_exit_walk
from kcoral_server.processes.launcher.forked_worker import set_dumpable
from kcoral_server.processes.limits import apply_memory_rlimit
from kcoral_server.worker.confinement import empty_private_tmp
from kcoral_server.worker.engine import Engine
from kcoral_server.worker.failures import exception_text
from kcoral_server.worker.leasing import Lease, WorkerExit
from kcoral_server.worker.reaper import become_subreaper, kill_descendants
from kcoral_server.worker.runtime import make_runtime
from kcoral_server.worker.state import InterruptGate, ProcessSnapshot
from kcoral_server.worker.warm_up import IDLE_BEFORE_WARM_UP_SECONDS, warm_up


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
        # the post-start state every program returns to; a one-shot worker's first program
        # is its last (taking it copied ~2 ms of pages shared with the launcher per start)
        interrupts = InterruptGate()
        interrupts.install()  # before the snapshot: each program's end restores it
        snapshot = None if configure.transient else ProcessSnapshot()
        engine = Engine(channel, runtime, lease, configure, snapshot, interrupts)
    except WorkerExit:
        return 0
    except Exception as exc:
        with contextlib.suppress(OSError):
            channel.send(WorkerStartFailed(error=exception_text(exc)))
        return 1
    # Start-up objects (torch's and numpy's included) live as long as the process: keep them
    # out of every later collection (SERVER §6 teardown collects after each program). A
    # one-shot worker only freezes: its start-up made little garbage, and collecting it
    # copied ~270 pages shared with the launcher (~1.5 ms of every spare's start).
    if not configure.transient:
        gc.collect()
    gc.freeze()
    ready = WorkerReady(
        pid=os.getpid(),
        target=identity.target,
        versions=identity.versions,
        device_uuid=identity.device_uuid,
    )
    channel.send(ready)
    if configure.warm_up and not channel.has_message(IDLE_BEFORE_WARM_UP_SECONDS):
        # a spare left waiting for its program copies the pages that program's path writes
        # to now, not on the request's round trip; one whose program comes at once (back to
        # back) would only spend CPU its seat's other processes need (``warm_up``)
        with contextlib.suppress(Exception):
            warm_up(stop=lambda: channel.has_message(0))
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


def run_exit_handlers() -> None:
    """What a program could observe of its process's exit, for a process that ends with
    ``os._exit``: atexit handlers, finalizers of its garbage, flushed stdio."""
    import atexit

    skip_idle_exit_walk()  # a forked worker's: the preload's finalizers, copied for nothing
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        gc.collect()  # start-up objects are frozen: this only walks what programs left
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def report_exit(channel: BlockingChannel, code: int) -> None:
    """A forked worker's last frame, ``WorkerExiting``: from then on the next program of its
    sandbox may run beside what is left of it, so it first turns non-dumpable again, like
    the worker forked ahead there (SERVER §6): that program cannot read its memory,
    environment or descriptors through ``/proc`` while it ends."""
    set_dumpable(False)
    with contextlib.suppress(OSError):
        channel.send(WorkerExiting(code=code))


def main(argv: list[str] | None = None) -> int:
    """``python -m kcoral_server.worker --fd N``: a spawned worker."""
    parser = argparse.ArgumentParser(prog="python -m kcoral_server.worker")
    parser.add_argument("--fd", type=int, required=True, help="the worker's socketpair end")
    args = parser.parse_args(argv)
    return run(args.fd)


def run(fd: int, *, forked: bool = False) -> int:
    """Run the worker on its socketpair end ``fd``; its exit code.

    ``forked``: a fork of the launcher, which ends with ``os._exit`` right after (interpreter
    finalization would touch, and so copy, every page it shares with the launcher). So the
    exit's observable part runs here (``run_exit_handlers``), then the descendants are
    killed, and the last frame, ``WorkerExiting``, tells the front-end the exit code: from
    then on nothing of the worker can change its last program's answer, which need not
    wait the ~15 ms the kernel takes to tear down a process that maps torch (issue 31;
    SERVER §8). Not sent when a descendant could not be killed: the front-end then waits
    for the exit and the launcher's report, as for a spawned worker."""
    apply_memory_rlimit()  # before anything big is imported or allocated
    empty_private_tmp()  # a sandbox's private /tmp holds what the seat's last worker left
    sock = socket.socket(fileno=fd)
    channel = BlockingChannel(sock)
    code = 1  # the front-end is gone or speaks nonsense: nothing left to report to
    try:
        code = serve(channel)
    except (OSError, IpcError):
        pass
    finally:
        if forked:
            run_exit_handlers()
        _found, verified = kill_descendants()
        if forked and verified:
            report_exit(channel, code)
        with contextlib.suppress(OSError):
            sock.close()
    return code
