"""``kcoral run`` whose token an operator rotates while the tool runs (``SIGHUP`` with a new
token for the same name, EXTENSIONS §6): the job runs on, and the one line says so, for how
long unfollowed (kcoral run asks the server to cancel it 60 s after its last follower went,
EXTENSIONS §5; the line said only "runs on") and how to follow it. Before, the run ended with
only ``server error: HTTP 401: missing or invalid bearer token; set KCORAL_TOKEN ...``, as if
nothing had been started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_process import client_token_file, running_server

from kcoral import Client

pytestmark = pytest.mark.timeout(120)

OLD_TOKEN = "token-dave-old-0123456789"
NEW_TOKEN = "token-dave-new-9876543210"


def test_a_run_whose_token_is_rotated_says_its_job_runs_on_and_how_to_follow_it(
    tmp_path: Path,
) -> None:
    tokens = client_token_file(tmp_path, f"dave {OLD_TOKEN}\n")
    marker = tmp_path / "started"
    args = ["--log-dir", "", "--auth-token-file", str(tokens), "--sandbox", "none"]
    with running_server(tmp_path / "server", args) as server:
        code = (
            "import pathlib, sys, time\n"
            f"pathlib.Path({str(marker)!r}).write_text('x')\n"
            "while not pathlib.Path(sys.argv[1] + '.go').exists(): time.sleep(0.05)\n"
            "print('done')\n"
        )
        run = subprocess.Popen(
            [sys.executable, "-m", "kcoral", "run", "python", "--url", server.url, "--",
             "-c", code, str(marker)],
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "KCORAL_TOKEN": OLD_TOKEN},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert run.poll() is None, run.communicate()
                assert time.monotonic() < deadline, "the tool never started"
                time.sleep(0.05)
            tokens.write_text(f"dave {NEW_TOKEN}\n")
            server.process.send_signal(signal.SIGHUP)
            _out, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 1
        said = err.strip().splitlines()[-1]
        found = re.fullmatch(
            r"kcoral run: the server stopped accepting this token while the tool ran \(rotated "
            r"or revoked\?\); a rotated token's job (\S+) runs on, and is cancelled 60 s "
            r"after its last follower went: follow it with "
            rf"kcoral\.Client\('{re.escape(server.url)}'\)\.job\('\1'\) and KCORAL_TOKEN set "
            r"to the new token",
            said,
        )
        assert found, said
        # Followed as the line says, the job is there and finishes once let go.
        (marker.parent / (marker.name + ".go")).write_text("")
        with Client(server.url, token=NEW_TOKEN) as client:
            result = client.job(found.group(1)).result()
        assert result.status == "COMPLETED", result
