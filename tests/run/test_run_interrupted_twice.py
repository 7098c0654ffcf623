"""``kcoral run`` interrupted a second time while it waits for its job's cancel: it stops
waiting and says what is known. It said ``interrupted; the remote tool was cancelled``,
which nothing had confirmed; the server ends a job nobody follows (EXTENSIONS §5, §7).

The server is a stand-in whose job runs and whose ``DELETE`` never answers, so the second
interrupt lands in that wait, whatever the machine's speed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from stand_in_http import StandIn, serving

pytestmark = pytest.mark.timeout(120)

CANCEL_ASKED = threading.Event()
RELEASE = threading.Event()
JOB_ID = str(uuid.uuid4())
#: what the stand-in's /v1/info lists (``cancel-unfollowed``: it ends a job nobody follows)
FEATURES: list[str] = []


class RunningJobServer(StandIn):
    """Offers jobs, accepts one, streams its first line, and never answers its cancel."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/v1/info":
            self.send_json({"features": FEATURES, "device": "cpu"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        assigned = {"phase": "assigned", "worker_id": "w0", "gpu_ids": []}
        self.wfile.write(f"id: 1\nevent: phase\ndata: {json.dumps(assigned)}\n\n".encode())
        line = json.dumps({"text": "started\n"})
        self.wfile.write(f"id: 2\nevent: stdout\ndata: {line}\n\n".encode())
        self.wfile.flush()
        RELEASE.wait(60)  # the tool runs on

    def do_POST(self) -> None:
        self.read_body()
        accepted = {"job_id": JOB_ID, "request_id": str(uuid.uuid4()), "status": "QUEUED"}
        self.send_json(accepted, 202)

    def do_DELETE(self) -> None:
        CANCEL_ASKED.set()
        RELEASE.wait(60)  # the cancel is never confirmed


@pytest.mark.parametrize(
    ("features", "said"),
    [
        (["jobs", "cancel-unfollowed"], b"the server ends the remote tool within 60 s"),
        # a server that does not end unfollowed jobs: nothing is promised (review)
        (["jobs"], b"the remote tool may run on"),
    ],
)
def test_a_second_interrupt_during_the_cancel_says_it_was_not_confirmed(
    tmp_path: Path, features: list[str], said: bytes
) -> None:
    FEATURES[:] = features
    CANCEL_ASKED.clear()
    RELEASE.clear()
    with serving(RunningJobServer) as url:
        command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url, "--",
                   "-c", "print('started')"]  # fmt: skip
        run = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert run.stdout is not None
            assert run.stdout.readline() == b"started\n"
            run.send_signal(signal.SIGINT)
            assert CANCEL_ASKED.wait(60), "no cancel came"
            run.send_signal(signal.SIGINT)
            _out, err = run.communicate(timeout=60)
        finally:
            RELEASE.set()
            if run.poll() is None:
                run.kill()
                run.wait()
    unconfirmed = b"kcoral run: interrupted; the cancel was not confirmed (interrupted again); "
    assert err == unconfirmed + said + b"\n"
    assert run.returncode == 130
