"""Noticing a worker process's exit and killing its process tree (SERVER §8, §11).

A worker may leave descendants (uploaded code forks); its exit is noticed by its pid, not
only by its channel's EOF, and a kill is confirmed only by the exit report of whoever
accounts for the tree: the launcher for a forked worker, the supervisor or bubblewrap for
a spawned one. What cannot be confirmed is said (``kill_tree``'s answer), so that the pool
quarantines the worker's GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence

from kcoral_server.processes import procfs
from kcoral_server.processes.launcher.front_end import ForkedProcess, cleanup_confirm_seconds
from kcoral_server.processes.pidfd import open_pidfd

__all__ = ["kill_tree", "kill_tree_now", "poll_exit", "survivors_of", "watch_exit"]

Process = subprocess.Popen | ForkedProcess


def survivors_of(process: Process | None) -> int:
    """Descendants the launcher found alive after ``SIGKILL`` when it reported the exit
    (-1: unknown, the launcher went away); 0 for spawned workers, whose accountant does
    not exit while any remain."""
    return getattr(process, "survivors", 0)


async def watch_exit(
    process: Process, process_exited: Callable[[], None], exited: asyncio.Event
) -> None:
    """Notice the process's death by its pid, not only by the channel's EOF (a forked
    descendant may hold the worker's end open): ``process_exited`` then fails the channel
    behind every frame already received. ``exited`` is set once the exit code is known,
    which for a forked worker also means the launcher has killed what it left behind."""
    # Both descriptors are the watcher's own: ``poll`` may close the status pipe's
    # original at any time, and the loop must never watch a closed (reusable) number.
    try:
        pidfd = open_pidfd(process.pid)  # None without pidfds: report or polling below
    except ProcessLookupError:
        pidfd = None  # already gone: the status pipe or poll() tells
    status_fd = getattr(process, "status_fd", None)
    report: int | None = None
    if status_fd is not None:
        with contextlib.suppress(OSError):
            report = os.dup(status_fd)
    try:
        watched = [fd for fd in (pidfd, report) if fd is not None]
        if watched:
            await _readable(watched)  # death, or the report of a death
        else:
            await poll_exit(process, None)
        process_exited()
        if report is not None:
            await _readable([report])  # the exit code is written (or the launcher left)
    finally:
        for fd in (pidfd, report):
            if fd is not None:
                os.close(fd)
    await poll_exit(process, None)  # a launcher that died before reporting
    exited.set()


async def poll_exit(process: Process, timeout: float | None) -> bool:
    """Whether ``process`` exited within ``timeout``, by polling: for a process whose
    ``watch_exit`` never started (a launch cancelled once the fork was under way), and
    where nothing else tells."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while process.poll() is None:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def kill_tree(
    process: Process, grace: float, wait_exit: Callable[[float | None], Awaitable[bool]]
) -> str | None:
    """Kill the whole process tree (SIGTERM, SIGKILL after ``grace``); answer why its end
    could not be confirmed (None: confirmed): no exit report (``wait_exit``) within
    ``cleanup_confirm_seconds()`` of the SIGKILL, or one that counts descendants which
    survived it."""
    # A spawned worker runs under an accountant (its supervisor, or bubblewrap with its
    # PID namespace) that exits only once everything below it is gone: it is never
    # signalled itself, so that its exit stays proof of the clean-up.
    accountant = not isinstance(process, ForkedProcess)

    def tree(known: list[int]) -> list[int]:
        """The tree's live processes: ``known`` ones still alive, descendants found since,
        and the worker itself (first) unless an accountant looks after it."""
        found = [pid for pid in known if procfs.is_alive(pid)]
        found += [pid for pid in procfs.descendants(process.pid) if pid not in found]
        if not accountant and process.poll() is None and process.pid not in found:
            found.insert(0, process.pid)
        return found

    def group() -> int | None:
        return None if accountant else _group(process)

    pids = tree([])
    procfs.signal_all(pids, signal.SIGTERM, group=group())
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = tree(pids)
        if not pids and (not accountant or process.poll() is not None):
            break
        if process.returncode is None:
            # woken by the exit itself: usually the worker was ending anyway (a one-shot
            # worker that announced its exit, SERVER §8) and its seat's next one waits
            await wait_exit(0.02)
        else:
            await asyncio.sleep(0.02)  # gone; descendants it left are polled
    procfs.signal_all(tree(pids), signal.SIGKILL, group=group())
    confirm = cleanup_confirm_seconds()
    if not await wait_exit(confirm) and not await ended_with_its_sandbox(
        process, wait_exit, confirm
    ):
        return f"worker {process.pid}: no exit report {confirm:g} s after SIGKILL"
    survivors = survivors_of(process)
    if survivors < 0 and await namespace_ended(process, confirm):
        survivors = 0  # its launcher left no report, but its sandbox's namespace is gone
    if survivors:
        return f"worker {process.pid}: " + (
            "its launcher died before reporting on its descendants"
            if survivors < 0
            else f"{survivors} descendant(s) survived SIGKILL"
        )
    return None


async def namespace_ended(process: Process, timeout: float) -> bool:
    """Whether the init of ``process``'s sandbox PID namespace exits within ``timeout``:
    proof that nothing of the worker's tree runs (``procfs.init_gone``). A launcher that
    died before reporting (killed, out of memory) ends its sandbox, so its seat's worker
    is then confirmed gone instead of quarantining the GPUs and stopping the whole server
    (SERVER §11). Unsandboxed there is no such proof, and nothing changes."""
    init = getattr(process, "namespace_init", None)
    if init is None:
        return False
    deadline = time.monotonic() + timeout
    while not procfs.init_gone(init):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def ended_with_its_sandbox(
    process: Process, wait_exit: Callable[[float | None], Awaitable[bool]], timeout: float
) -> bool:
    """Whether a sandboxed worker whose launcher sent no exit report ends with its whole
    sandbox: its PID namespace's init is killed, which the kernel follows by killing every
    process there, the launcher included, whose end then reports the worker's. A program
    runs as its launcher's user in one sandbox, so it can stop it (``SIGSTOP``): its seat
    then reported no worker's end, the pool quarantined, and every identity's programs
    were refused until the operator restarted the server. Unsandboxed: False."""
    init = getattr(process, "namespace_init", None)
    if init is None:
        return False
    procfs.kill_identity(init)
    return await wait_exit(timeout)


def kill_tree_now(process: Process) -> None:
    """Blocking SIGKILL of the tree: for a start-up that was cancelled (e.g. a replacement
    during shutdown), which nobody will ``kill``."""
    if process.poll() is None:
        procfs.signal_all(
            [process.pid, *procfs.descendants(process.pid)], signal.SIGKILL, group=process.pid
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)


def _group(process: Process) -> int | None:
    """The worker's process group while it can still have members: once the exit code
    is known the whole tree is gone (the launcher or the supervisor saw to it) and the
    number may name someone else's group."""
    if process.returncode is not None:
        return None
    return process.pid


async def _readable(fds: Sequence[int]) -> None:
    """Wait until one of ``fds`` is readable (the readers are gone again on return)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        for fd in fds:
            loop.remove_reader(fd)
