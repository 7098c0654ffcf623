"""The one-worker supervisor of a spawned worker (SERVER §11), in its own process.

``python -m kcoral_server.processes.launcher --supervise <front-end pid>`` (the command
``front_end.supervised_command`` builds): a child subreaper that forks and execs the worker
command, kills what the worker leaves behind before it exits with the worker's code, dies
with the front-end, and takes the worker with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal

from kcoral_server.processes.launcher.family import Family, watch_parent
from kcoral_server.processes.launcher.wire import SUPERVISE_ENV
from kcoral_server.worker.reaper import become_subreaper, tie_to_parent


def supervise(parent: int) -> int:
    """The supervisor process: fork and exec the command, wait for it and its orphans."""
    command = json.loads(os.environ.pop(SUPERVISE_ENV))
    become_subreaper()
    alive, parent_fd = watch_parent(parent)
    if not alive:
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # SIGTERM is for the worker (the kill path signals every process of the tree): the
    # supervisor stays to clean up after it. Handlers are reset by exec in the child.
    signal.signal(signal.SIGTERM, lambda *_: None)
    own = {wake_r, wake_w, *(() if parent_fd is None else (parent_fd,))}
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        if not tie_to_parent(supervisor):
            os._exit(1)
        for fd in own:
            os.close(fd)
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    # The worker's descriptors (its IPC end above all) must close when the worker dies.
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in own:
            with contextlib.suppress(OSError):
                os.close(fd)
    family = Family(kept={pid})
    family.workers[pid] = -1
    # The supervisor's exit is the worker's exit report, so it stays while an orphan
    # survives SIGKILL: the front-end, which never signals the supervisor itself, then sees
    # no exit and quarantines instead of trusting a clean-up that did not happen.
    while pid not in family.reported or family.orphans:
        watched = [wake_r] if parent_fd is None else [wake_r, parent_fd]
        readable, _w, _x = select.select(watched, [], [], family.poll_interval)
        if parent_fd is not None and parent_fd in readable:
            family.kill_all()
            return 1
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        family.collect()
    code = family.reported[pid]
    if code < 0:  # killed by a signal: end the same way, so the front-end sees the same code
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code
