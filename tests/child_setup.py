"""Set up a child process (a lower open-files limit, SIGHUP back to default) without
``preexec_fn``.

``subprocess``'s ``preexec_fn`` forks the test process and runs Python in the child before
``exec``. Once a test has used gRPC, its event engine's fork handler restarts a poller
thread in that child, which then finds its epoll descriptor closed by ``close_fds`` and can
end the child before ``exec`` (CI on 2c7bd75: ``epoll_wait error: Bad file descriptor``,
the router "exited" with nothing else in its log). A small Python in front of the command
does the setting and ``exec``\\s the command instead, after a plain ``fork``/``exec``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

_SET_LIMIT_THEN_EXEC = (
    "import os, resource, sys\n"
    "soft, hard = int(sys.argv[1]), int(sys.argv[2])\n"
    "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1] if hard < 0 else hard\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)

_DEFAULT_HANGUP_THEN_EXEC = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def under_open_file_limit(command: Sequence[str], soft: int, hard: int | None = None) -> list[str]:
    """``command`` run with ``RLIMIT_NOFILE`` lowered to ``soft`` (and ``hard``; left as it
    is when ``None``). ``command[0]`` must be a path, as ``sys.executable`` is."""
    hard_given = -1 if hard is None else hard
    return [sys.executable, "-c", _SET_LIMIT_THEN_EXEC, str(soft), str(hard_given), *command]


def with_default_hangup(command: Sequence[str]) -> list[str]:
    """``command`` run with SIGHUP's default action, as from a terminal, even when the tests
    run under ``nohup`` (SIGHUP ignored, which ``exec`` keeps)."""
    return [sys.executable, "-c", _DEFAULT_HANGUP_THEN_EXEC, *command]


_STOP_SIGNAL_AS_THE_LOOP_CLOSES = (
    "import os, runpy, signal, sys, threading\n"
    "from asyncio import selector_events\n"
    "close_self_pipe = selector_events.BaseSelectorEventLoop._close_self_pipe\n"
    "def closing(loop):\n"
    "    close_self_pipe(loop)\n"
    "    if threading.current_thread() is threading.main_thread():\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "selector_events.BaseSelectorEventLoop._close_self_pipe = closing\n"
    "sys.argv = [sys.argv[1], *sys.argv[2:]]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


def with_a_stop_signal_as_the_loop_closes(command: Sequence[str]) -> list[str]:
    """``command`` (``python -m MODULE ARGS``) run so that its main thread's asyncio loop,
    as it closes, sends the process a SIGTERM just after closing its self-pipe and before
    removing its signal handlers: a second stop landing while the process exits."""
    python, flag, module, *arguments = command
    if flag != "-m":
        raise ValueError(f"expected python -m MODULE ..., not {command!r}")
    return [python, "-c", _STOP_SIGNAL_AS_THE_LOOP_CLOSES, module, *arguments]
