"""A freshly forked child of the fork server, from the fork until it runs the worker.

``become_worker`` runs first, still on the launcher's stack: it resets what the launcher
set for itself, ties the child to the launcher, enters the worker's cgroups before anything
else runs (or is moved there by the front-end), waits for the front-end's go where asked,
and drops the launcher's descriptors and bookkeeping. Once the launcher's stack is
unwound, ``run_child`` takes the worker's environment and runs the worker, and
``quick_exit`` ends the process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from kcoral_server.processes.cgroups import enter_cgroups
from kcoral_server.processes.launcher.family import Family
from kcoral_server.worker.reaper import prctl, tie_to_parent

PR_SET_DUMPABLE = 4


def set_dumpable(dumpable: bool) -> bool:
    """``PR_SET_DUMPABLE`` (Linux): a non-dumpable process cannot be ptraced, nor its
    ``/proc/<pid>/mem`` and ``environ`` read, by other processes of its user without
    ``CAP_SYS_PTRACE``. False where unsupported."""
    return prctl(PR_SET_DUMPABLE, int(dumpable))


@dataclass
class Child:
    """What a freshly forked child runs once the launcher's stack is unwound."""

    worker_fd: int
    env: dict[str, str]
    cgroups: list[str] = field(default_factory=list)


def become_worker(
    child: Child,
    *,
    launcher: int,
    go: int | None,
    control: socket.socket,
    launcher_fds: Sequence[int],
    family: Family,
    stdio: int | None = None,
) -> Child:
    """In the child, right after the fork: leave the launcher behind (``launcher`` is its
    pid, ``control`` its socket, ``launcher_fds`` its other descriptors, ``family`` its
    bookkeeping), enter ``child``'s cgroups, then wait for the front-end's go on the pipe
    ``go`` where one is given. Exits the process rather than run a worker outside its
    limits, or one the front-end gave up on. ``stdio`` (``/dev/null``, one of
    ``launcher_fds``) replaces descriptors 0, 1 and 2: the launcher's are the pipe the
    front-end relays to its console, which no program may read or write (``log_relay``)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's is a no-op (fork_server)
    if not tie_to_parent(launcher):
        os._exit(1)  # the launcher died before the prctl: nobody will supervise us
    if stdio is not None:
        for target in (0, 1, 2):
            os.dup2(stdio, target)
    try:
        # Before anything else runs: limits hold from the start. Moving into a cgroup waits
        # for an RCU grace period (~10 ms), which is why a spare is forked ahead.
        enter_cgroups(child.cgroups)
    except OSError:
        os._exit(125)  # never run a worker outside its limits (like the spawn shim)
    # Before any wait: the launcher's descriptors include the status pipes of its other
    # workers, whose exit reports end at EOF once the launcher closes its copy.
    control.close()
    for fd in launcher_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    family.forget()
    os.setsid()  # like start_new_session=True: the front-end kills the whole group
    if go is not None:
        # A sandboxed launcher's child is moved into its cgroups by the front-end, which
        # then says go; a worker forked ahead (SERVER §6) waits here until its seat needs
        # it. Nothing of the worker runs before (an empty read: the front-end gave up).
        # Still non-dumpable meanwhile, like the launcher: the program running beside it
        # in the same sandbox cannot ptrace it or read its memory.
        try:
            if os.read(go, 1) != b"g":
                os._exit(125)
        except OSError:
            os._exit(125)
        os.close(go)
    set_dumpable(True)  # the worker's /proc files stay its own (tools read them)
    return child


def take_environment(env: dict[str, str]) -> None:
    """Make ``os.environ`` (and the C environment) exactly ``env``. Only what differs is
    changed: a CPU worker's usually equals the launcher's, and clearing and refilling it
    copied ~60 more shared pages (~0.3 ms) of every fresh fork."""
    current = os.environ
    for name in [name for name in current if name not in env]:
        del current[name]
    for name, value in env.items():
        if current.get(name) != value:
            current[name] = value


def run_child(child: Child) -> int:
    """In the forked worker: take the requested environment, then run the worker (which
    runs what a program could observe of the exit itself: ``worker.main.run``)."""
    take_environment(child.env)
    from kcoral_server.worker import __main__ as entry
    from kcoral_server.worker.main import run

    sys.argv = [entry.__file__, "--fd", str(child.worker_fd)]  # as if spawned
    # ``run``, not ``main``: no argument parsing (~3 ms in a fresh fork, which copies the
    # pages it touches) for arguments the launcher itself makes
    return run(child.worker_fd, forked=True)


def quick_exit(code: int) -> None:
    """Exit a forked worker without interpreter finalization: tearing down every module
    touches (and so copies) every page shared with the launcher, ~15 ms per worker. What a
    program could observe of it (atexit handlers, finalizers of its garbage, flushed stdio)
    already ran in the worker (``worker.main.run_exit_handlers``)."""
    os._exit(code)
