"""A command run with a pseudo-terminal as its standard streams, as in a user's terminal
window: what it wrote there, byte for byte (``kcoral run`` and terminal IPython tests; a
module name unique across the test tree, so plain ``import`` finds it from any folder)."""

from __future__ import annotations

import os
import pty
import select
import sys
from collections.abc import Mapping


def on_a_terminal(command: list[str], env: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """Run ``command`` (``sys.executable``'s arguments) on a new pseudo-terminal until it
    exits; its exit status and everything it wrote to the terminal."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        try:
            os.execve(sys.executable, command, dict(os.environ if env is None else env))
        finally:
            os._exit(127)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: the child has gone and closed its side
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(terminal)
        _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status), seen


def read_until(terminal: int, end: str, give_up_seconds: float = 10.0) -> str:
    """What the pseudo-terminal ``terminal`` (its master side) shows, read until it ends
    with ``end`` (or nothing more comes for ``give_up_seconds``): one read may return only
    part of what was written, the kernel passing a pty's bytes on in its own time."""
    seen = ""
    while not seen.endswith(end):
        ready, _, _ = select.select([terminal], [], [], give_up_seconds)
        if not ready:
            break
        seen += os.read(terminal, 65536).decode()
    return seen
