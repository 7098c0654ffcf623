"""Descendant tracking: the worker is a child subreaper and kills what a program left.

As a subreaper, orphans of the program (double forks, ``setsid`` daemons) are re-parented
to the worker instead of init, so walking ``/proc/<pid>/task/*/children`` from the worker
finds every live descendant (``kcoral_server.processes.procfs``, shared with the launcher and the
front-end). The launcher (the workers' parent) uses ``tie_to_parent`` for lifetimes and the
subreaper mark too (SERVER §11).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from typing import Any

from kcoral_server.processes.procfs import children, kill_process, live_descendants

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux, or no such call: every prctl below reports False


#: libc's ``prctl``, looked up once, in the fork server before it forks: a ``CDLL`` made in
#: each fresh fork built its function class again (~70 copied pages, ~0.3 ms per worker)
_LIBC_PRCTL = _libc_prctl()


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value, 0, 0, 0)`` (Linux); False where it failed or is missing."""
    if _LIBC_PRCTL is None:
        return False
    try:
        return bool(_LIBC_PRCTL(option, value, 0, 0, 0) == 0)
    except OSError:
        return False


def become_subreaper() -> bool:
    """Mark this process as a child subreaper (Linux); False where unsupported."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def tie_to_parent(parent: int, sig: int = signal.SIGKILL) -> bool:
    """Get ``sig`` when the parent dies (``PR_SET_PDEATHSIG``, where supported). False when
    the parent ``parent`` is already gone: the caller should exit.

    The parent may die before the ``prctl``: then this process was re-parented already and
    no signal will ever come, hence the ``getppid`` check after it. The signal follows the
    parent *thread* that forked: only use it under a single-threaded parent.
    """
    prctl(PR_SET_PDEATHSIG, sig)
    return os.getppid() == parent


def reap_children() -> None:
    """Collect exit statuses of finished direct children (never blocks)."""
    for pid in children(os.getpid()):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


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
            kill_process(pid)
        # Killed parents hand their children to us; give the kernel a moment, then reap.
        time.sleep(0.01)
