"""Reading process trees from ``/proc``: one module for the front-end, the fork server and
the worker (stdlib only: the fork server and the worker import it before anything else).

``/proc/<pid>/task/*/children`` lists a process's children per thread; a process that is
a child subreaper (the worker, the fork server) gets orphans of its descendants re-parented
to it, so walking these files from it finds every live descendant. Processes come and go
while the files are read: every reader treats a vanished file as "no such process".
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence

from kcoral_server.processes.pidfd import open_pidfd


def read_kernel_file(path: str | os.PathLike[str]) -> bytes:
    """The whole of a small ``/proc`` or ``/sys`` file, by raw reads: not ``open()`` or
    ``Path.read_text``, whose file object costs more than the read (these are read after
    every program: 21 against 52 µs a file on the 2-core machine). Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return data
    finally:
        os.close(fd)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (zombies included)."""
    found: list[int] = []
    # listdir and raw reads, not glob and open(): the worker asks after every program
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found  # the process went away
    for task in tasks:
        try:
            data = read_kernel_file(f"/proc/{pid}/task/{task}/children")
            found.extend(int(part) for part in data.split())
        except (OSError, ValueError):
            continue  # the task or process went away meanwhile
    return found


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


def state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``Z``, ...); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            data = handle.read()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: the state follows the last ')'
    return data[data.rfind(")") + 2 :][:1] or None


def _stat_field(pid: int | str, index: int) -> int | None:
    """Numeric field ``index`` after the command name of ``/proc/<pid>/stat`` (0 is the
    state; ``pid`` may be ``"<pid>/task/<tid>"``); None when the process is gone. Pids are
    those of the reader's namespace."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2 :].split()
    try:
        return int(fields[index])
    except (IndexError, ValueError):
        return None


def parent(pid: int) -> int | None:
    """The parent of ``pid`` (None when it is gone)."""
    return _stat_field(pid, 1)


def sid(pid: int) -> int | None:
    """The POSIX process-session id of ``pid``, as ``getsid(2)`` names it (inherited by its
    children until one calls ``setsid``; "session" alone means a KCoral session here)."""
    return _stat_field(pid, 3)


#: ``PF_EXITING`` in a thread's ``stat`` flags (``include/linux/sched.h``): it is in
#: ``do_exit`` and runs no more user code
PF_EXITING = 0x4


def exiting(pid: int) -> bool:
    """True when ``pid`` can run no more code: gone, or every thread of it exiting. A killed
    process is exiting within microseconds, while the kernel may take tens of milliseconds
    more to tear its memory down; a number reused by a new process reads as not exiting."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in threads:
        flags = _stat_field(f"{pid}/task/{tid}", 6)
        if flags is not None and not flags & PF_EXITING:
            return False
    return True


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has already finished)."""
    return state(pid) not in (None, "Z", "X")


def live_descendants(pid: int | None = None) -> list[int]:
    """Descendants of ``pid`` (default: this process) that are not zombies."""
    return [child for child in descendants(pid) if is_alive(child)]


def namespace_pid(pid: int) -> str | None:
    """The pid of ``pid`` in its innermost PID namespace (last ``NSpid`` field)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            line = next((x for x in handle if x.startswith("NSpid:")), "")
    except OSError:
        return None
    fields = line.split()
    return fields[-1] if len(fields) > 1 else None


def pid_namespace(pid: int) -> int | None:
    """The inode of ``pid``'s PID namespace (None when it is gone or unreadable)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


#: a process as ``(host pid, start time)``: the start time tells a reused number apart
Identity = tuple[int, int]


def identity(pid: int) -> Identity | None:
    started = _stat_field(pid, 19)  # starttime (field 22), clock ticks since boot
    return None if started is None else (pid, started)


def namespace_init(pid: int) -> Identity | None:
    """The init (pid 1) of ``pid``'s PID namespace when that is not this process's own (a
    sandbox's), found among ``pid``'s ancestors; else None."""
    namespace = pid_namespace(pid)
    if namespace is None or namespace == pid_namespace(os.getpid()):
        return None
    init = pid
    while (up := parent(init)) is not None and up > 0 and pid_namespace(up) == namespace:
        init = up
    return identity(init) if namespace_pid(init) == "1" else None


def init_gone(init: Identity) -> bool:
    """Whether a namespace's init has exited. The kernel kills every process of a PID
    namespace, nested ones included, when its init exits, and the init's exit completes
    only once they are all gone: then nothing of the namespace can run."""
    pid, started = init
    return not is_alive(pid) or identity(pid) != (pid, started)


def kill_identity(target: Identity, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` (SIGKILL) to ``target`` unless it has exited and its number names another
    process now."""
    pid = target[0]
    try:
        fd = open_pidfd(pid)
    except ProcessLookupError:
        return
    # checked through the pidfd's own process: a number reused after the check is safe
    if identity(pid) != target:
        if fd is not None:
            os.close(fd)
        return
    _send_signal(pid, fd, sig)


def kill_process(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid`` through a pidfd (a plain ``kill`` where pidfds are unsupported)."""
    # A pidfd names this very process, so a recycled pid can never be hit by mistake.
    try:
        fd = open_pidfd(pid)
    except ProcessLookupError:
        return
    _send_signal(pid, fd, sig)


def _send_signal(pid: int, fd: int | None, sig: int) -> None:
    """Send ``sig`` through ``fd``, ``pid``'s pidfd, and close it; a plain ``kill`` where
    pidfds are unsupported (``fd`` None: the pid is our own unreaped child, or checked)."""
    try:
        with contextlib.suppress(OSError):  # gone meanwhile
            if fd is None:
                os.kill(pid, sig)
            else:
                signal.pidfd_send_signal(fd, sig)
    finally:
        if fd is not None:
            os.close(fd)


def signal_all(pids: Sequence[int], sig: int, *, group: int | None = None) -> None:
    """Send ``sig`` to the process group ``group`` (when given) and to each of ``pids``,
    ignoring those already gone."""
    if group is not None:
        with contextlib.suppress(OSError):
            os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
