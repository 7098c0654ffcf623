"""Attack: a program reads or writes the server's console through inherited descriptors.

Before the fix every worker's descriptors 1 and 2 were the front-end's own stdout and
stderr (the launcher was started without redirecting them), and the output capture kept
dups of them in the program's process. With the server's stderr a regular file (as here,
and under systemd with a log file), a sandboxed program of one token holder re-opened
``/proc/self/fd/N`` and read every identity's console lines (another identity's crashed
program's ``output_tail``, request ids, client addresses) and wrote forged event lines;
``output_limit_bytes: 0`` even sent a program's prints there directly. Now launchers and
workers never hold the front-end's stdio: a worker's 0, 1 and 2 are ``/dev/null``, and the
launcher's own messages reach the console through a pipe only it holds
(``kcoral_server.processes.launcher.log_relay``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from identity_support import TOKEN_A, TOKEN_B, token_file
from sandbox_default_support import bwrap_problem, execute, returned, run_source
from server_process import RunningServer, start_server

SECRET = "ALICE-CONSOLE-SECRET-4d1c9e"
FORGED = "2026-12-05T00:00:00.000Z ERROR   forged_event by=bob-7f3a"

CRASH = f"import os\ndef main():\n    print({SECRET!r}, flush=True)\n    os._exit(3)\n"

# Every descriptor of every process the program can see: read what can be re-opened, and
# write a forged console line into whatever takes one (files and pipes only: an eventfd or
# a socket is no console).
SPY = """
import json, os

def main(forged):
    found, written = {}, []
    for pid in ["self"] + [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(path)
            except OSError:
                continue
            if not (target.startswith("/") or target.startswith("pipe:")):
                continue
            try:
                handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    found[path] = os.read(handle, 1 << 22).decode(errors="replace")
                finally:
                    os.close(handle)
            except OSError:
                pass
            try:
                handle = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_APPEND)
                try:
                    os.write(handle, (forged + chr(10)).encode())
                    written.append(target)
                finally:
                    os.close(handle)
            except OSError:
                pass
    for fd in (1, 2):
        os.write(fd, (forged + chr(10)).encode())
    print(forged, flush=True)
    return json.dumps({"found": found, "written": written})
"""


def _uncaptured(program: dict) -> dict:
    """``program`` with capture off: its prints once went straight to the console."""
    return {**program, "options": {"output_limit_bytes": 0}}


def _console_server(tmp_path: Path, launch: str) -> RunningServer:
    tokens = token_file(tmp_path / "secrets")
    args = ["--sandbox", "bubblewrap", "--auth-token-file", str(tokens)]
    # one-shot workers: every program in a fresh fork (or spawn) of the seat's sandbox
    args += ["--max-requests-per-worker", "1"]
    return start_server(tmp_path / "server", args, env={"KCORAL_WORKER_LAUNCH": launch})


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap unusable: {bwrap_problem()}")
@pytest.mark.parametrize("launch", ["fork", "spawn"])
def test_a_sandboxed_program_can_neither_read_nor_write_the_servers_console(
    tmp_path: Path, launch: str
) -> None:
    server = _console_server(tmp_path, launch)
    try:
        crashed = execute(server.url, run_source(CRASH), TOKEN_A)
        assert crashed["status"] == "FAILED", crashed
        assert SECRET in server.stderr()  # the console holds alice's output now
        spied = returned(execute(server.url, run_source(SPY, args=[FORGED]), TOKEN_B))
        again = execute(server.url, _uncaptured(run_source(SPY, args=[FORGED])), TOKEN_B)
        assert again["status"] == "COMPLETED", again
    finally:
        server.stop()
    read = {path: text for path, text in spied["found"].items() if SECRET in text}
    assert read == {}, read
    assert str(server.stderr_path) not in spied["written"]
    assert FORGED not in server.stderr()


# A torch whose import fails: the launcher's preload says so on its stderr.
BROKEN_TORCH = "raise RuntimeError('torch broken for the relay test')\n"


@pytest.mark.parametrize("sandbox", ["none", "bubblewrap"])
def test_the_launchers_own_messages_still_reach_the_servers_console(
    tmp_path: Path, sandbox: str
) -> None:
    if sandbox == "bubblewrap" and bwrap_problem() is not None:
        pytest.skip(f"bubblewrap unusable: {bwrap_problem()}")
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(BROKEN_TORCH)
    args = ["--sandbox", sandbox, "--worker-preload", "torch"]
    server = start_server(tmp_path / "server", args, env={"PYTHONPATH": str(site)})
    expected = "kcoral launcher: cannot preload torch: torch broken for the relay test"
    try:
        deadline = time.monotonic() + 60  # the preload starts once the launcher is idle
        while expected not in server.stderr() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        server.stop()
    assert expected in server.stderr(), server.stderr()[-3000:]
