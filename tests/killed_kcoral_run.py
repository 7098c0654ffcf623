"""A ``kcoral run`` killed outright (SIGKILL: ``kill -9``, the OOM killer) while its remote
tool runs, for the tests that its server, or a router in front of one, then cancels the
job nobody follows (``X-KCoral-Cancel-Unfollowed``, EXTENSIONS §5 and §7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kcoral import Client

#: the grace ``kcoral run`` asks for, shortened so that the tests need not wait a minute
GRACE_SECONDS = 2
#: ``kcoral run`` with that grace
SHORT_GRACE_RUN = (
    "import sys, kcoral.run.command as command; "
    f"command.UNFOLLOWED_CANCEL_SECONDS = {GRACE_SECONDS}; "
    "from kcoral.cli import main; sys.exit(main(sys.argv[1:]))"
)
#: the remote tool: says it started, then runs on for longer than any test waits
TOOL = "import time\nprint('started', flush=True)\ntime.sleep(200)\n"


def kill_a_running_kcoral_run(url: str, token: str, cwd: Path) -> None:
    """Start ``kcoral run python`` against ``url``, wait until its tool prints that it
    started, and kill the ``kcoral run`` with SIGKILL."""
    run = subprocess.Popen(
        [sys.executable, "-c", SHORT_GRACE_RUN, "run", "python", "--url", url, "--", "-c", TOOL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KCORAL_TOKEN": token},
        cwd=cwd,
    )
    try:
        assert run.stdout is not None
        assert run.stdout.readline() == "started\n"  # the remote tool runs
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()


def wait_for_the_end(client: Client, job_id: str, seconds: float) -> dict:
    """The job's status once it is neither queued nor running (within ``seconds``)."""
    deadline = time.monotonic() + seconds
    while (state := client.job(job_id).status())["status"] in ("QUEUED", "RUNNING"):
        assert time.monotonic() < deadline, f"the job ran on: {state}"
        time.sleep(0.1)
    return state
