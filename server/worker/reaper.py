"""Descendant tracking: the worker is a child subreaper and kills what a program left.

As a subreaper, orphans of the program (double forks, ``setsid`` daemons) are re-parented
to the worker instead of init, so walking ``/proc/<pid>/task/*/children`` from the worker
finds every live descendant. The launcher (the workers' parent) uses the same helpers for
what a dead worker left behind, and ``tie_to_parent`` for lifetimes (SERVER §11).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import signal
import time

from kcoral_server.pidfd import open_pidfd

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Mark this process as a child subreaper (Linux); False where unsupported."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def tie_to_parent(parent: int, sig: int = signal.SIGKILL) -> bool:
    """Get ``sig`` when the parent dies (``PR_SET_PDEATHSIG``, where supported). False when
    the parent ``parent`` is already gone: the caller should exit.

    The parent may die before the ``prctl``: then this process was re-parented already and
    no signal will ever come, hence the ``getppid`` check after it. The signal follows the
    parent *thread* that forked: only use it under a single-threaded parent.
    """
    _prctl(PR_SET_PDEATHSIG, sig)
    return os.getppid() == parent


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has already finished)."""
    return _state(pid) not in (None, "Z", "X")


def kill_process(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid`` through a pidfd (a plain ``kill`` where pidfds are unsupported)."""
    _kill(pid, sig)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (zombies included)."""
    found: list[int] = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as handle:
                found.extend(int(part) for part in handle.read().split())
        except (OSError, ValueError):
            continue  # the task or process went away meanwhile
    return found


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            data = handle.read()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: the state follows the last ')'
    return data[data.rfind(")") + 2 :][:1] or None


def descendants(pid: int | None = None) -> list[int]:
    """Every descendant of ``pid`` (default: this process), parents before children."""
    root = os.getpid() if pid is None else pid
    seen: list[int] = []
    pending = [root]
    while pending:
        for child in children(pending.pop()):
            if child not in seen:
                seen.append(child)
                pending.append(child)
    return seen


def live_descendants() -> list[int]:
    """Descendants that are not zombies (a zombie has already finished running)."""
    return [pid for pid in descendants() if _state(pid) not in (None, "Z", "X")]


def reap_children() -> None:
    """Collect exit statuses of finished direct children (never blocks)."""
    for pid in children(os.getpid()):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    # A pidfd names this very process, so a recycled pid can never be hit by mistake.
    try:
        fd = open_pidfd(pid)
    except ProcessLookupError:
        return
    if fd is None:  # no pidfds here: a plain kill (the pid is our own unreaped child)
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
        return
    try:
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


def kill_descendants(timeout: float = 10.0) -> tuple[bool, bool]:
    """Kill every live descendant and reap it.

    Returns ``(found_any, verified)``: whether live descendants existed, and whether none
    was left at the end (False means cleanup could not be confirmed).
    """
    found_any = False
    deadline = time.monotonic() + timeout
    while True:
        reap_children()
        live = live_descendants()
        if not live:
            return found_any, True
        found_any = True
        if time.monotonic() > deadline:
            return found_any, False
        for pid in live:
            _kill(pid)
        # Killed parents hand their children to us; give the kernel a moment, then reap.
        time.sleep(0.01)
