"""`kcoral run` in a terminal that is closed while the tool runs (CLIENT_API §11, EXTENSIONS §7)."""

from __future__ import annotations

import os
import pty
import signal
import sys
from pathlib import Path

import pytest

import kcoral


@pytest.mark.slow
def test_a_closed_terminal_ends_kcoral_run_with_129_and_cancels_the_tool(
    server_url: str, in_tmp: Path
) -> None:
    # Closing the terminal sends SIGHUP and fails every later write to it with EIO: the
    # line "terminated by SIGHUP" raised OSError, and kcoral run ended with status 1, where
    # the documented status of a closed terminal is 128 + SIGHUP.
    code = "import time\nfor i in range(3000):\n    print('tick', i, flush=True); time.sleep(0.1)"
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", server_url]
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        try:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            os.execv(sys.executable, [*command, "--", "-c", code])
        finally:
            os._exit(127)
    seen = b""
    try:
        while b"tick 1\r\n" not in seen:
            chunk = os.read(terminal, 4096)
            assert chunk, f"the terminal closed before the tool printed: {seen!r}"
            seen += chunk
    finally:
        os.close(terminal)  # the terminal window is closed
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 128 + signal.SIGHUP
    with kcoral.Client(server_url) as client:
        newest = client.jobs(limit=1)[0]
        assert newest["status"] == "CANCELLED"
