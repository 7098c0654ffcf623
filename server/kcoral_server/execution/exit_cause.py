"""Why a program's worker died, in words for the answer (SERVER §8).

A worker the kernel killed at its memory limit used to answer ``worker exited while
executing the instruction`` and nothing more: only the server log named the limit, and the
person who sent the program cannot read that log. The answer now says which limit, its
size and the flag that moves it, where the server can tell: the worker's cgroup counts its
OOM kills (``memory.events`` / ``memory.oom_control``) and refused forks (``pids.events``),
and the deadline is the server's own. Counters are read only once a worker is gone, never
on the happy path.
"""

from __future__ import annotations

import signal

from kcoral_server.processes.cgroups import WorkerCgroup
from kcoral_server.settings.config import ServerConfig

__all__ = [
    "OUTSIDE_SIGTERM",
    "SANDBOX_SIGTERM",
    "TIMEOUT_MESSAGE",
    "deadline_message",
    "exit_cause",
    "limit_cause",
    "size_text",
]

#: PROTOCOL §7.1: how the message of a program past its deadline starts
TIMEOUT_MESSAGE = "execution timed out"


def size_text(size: int) -> str:
    """``4.0 GiB``, ``512.0 MiB``, ``64.0 KiB`` or ``100 bytes``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def limit_cause(cgroup: WorkerCgroup | None) -> str | None:
    """The limit the worker's cgroup recorded hitting, as the clause that follows a crash's
    message and a colon (None: no cgroup, or none was hit). Read it before the cgroup is
    removed."""
    if cgroup is None:
        return None
    if cgroup.memory_limit_hit():
        return (
            "killed at its memory limit "
            f"({size_text(cgroup.memory_bytes)}, --worker-memory-limit-bytes)"
        )
    if cgroup.process_limit_hit():
        return (
            "it reached its process limit "
            f"({cgroup.processes} processes and threads, --worker-process-limit)"
        )
    return None


#: the cause of a worker that a SIGTERM the server did not send ended: a program can send
#: itself one too, so "from outside the server" alone sent its author away from their code
OUTSIDE_SIGTERM = (
    "killed by SIGTERM, which the server did not send (the program's own, or a scheduler "
    "or kill that stopped every process of the server?)"
)
#: the same, for a worker in a seat's sandbox: ``bwrap`` dies of that SIGTERM, and its PID
#: namespace takes the worker with it (SIGKILL), so the worker's own exit says nothing
SANDBOX_SIGTERM = (
    "killed with its sandbox, which a SIGTERM the server did not send ended (a scheduler or "
    "kill that stopped every process of the server?)"
)
#: signals that mean a fault in native code (the program's own, or a library it loaded)
NATIVE_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


def exit_cause(
    returncode: int | None, *, ended_alone: bool = False, launcher_returncode: int | None = None
) -> str | None:
    """How the worker ended, as the clause that follows a crash's message and a colon, when
    no limit explains it: ``killed by SIGSEGV (a fault in native code)``, ``it exited with
    status 3``. None: not known, or SIGTERM and SIGKILL, which the server's own kill of a
    worker still alive sends too. Before, a native crash and an ``os._exit`` read alike.

    ``ended_alone``: it had ended before the server's kill, so a SIGTERM came from outside:
    a plain ``scancel`` or a ``kill`` of every process signals the workers with the server.
    ``launcher_returncode``: how the process that forked it ended, where the worker's own
    exit code was lost with it (``ForkedProcess.launcher_returncode``)."""
    if ended_alone and returncode == -signal.SIGTERM:
        return OUTSIDE_SIGTERM
    if ended_alone and launcher_returncode == -signal.SIGTERM:
        return SANDBOX_SIGTERM
    if returncode is None or returncode in (-signal.SIGTERM, -signal.SIGKILL):
        return None
    if returncode >= 0:
        return f"it exited with status {returncode}"
    try:
        killed = signal.Signals(-returncode)
    except ValueError:
        return f"killed by signal {-returncode}"
    if killed in NATIVE_FAULTS:
        return f"killed by {killed.name} (a fault in native code)"
    return f"killed by {killed.name}"


def deadline_message(timeout: float, asked: float | None, config: ServerConfig) -> str:
    """The 504 ``timeout`` message: the deadline and the setting that set it. ``asked`` is
    the program's ``timeout_seconds`` (None: it gave none), ``config`` the server's."""
    largest = float(config.max_timeout_seconds)
    if asked is None:
        source = (
            "--default-timeout-seconds; a program sets its own with timeout_seconds, "
            f"up to --max-timeout-seconds ({largest:g} s)"
        )
    elif float(asked) > timeout:
        source = f"--max-timeout-seconds; the program asked for {float(asked):g} s"
    else:
        source = f"the program's timeout_seconds; --max-timeout-seconds allows {largest:g} s"
    return f"{TIMEOUT_MESSAGE} after its deadline of {timeout:g} s ({source})"
