"""``kcoral run`` interrupted while its inputs are sent: nothing runs on the server, and the
line says so. It said ``interrupted; the remote tool was cancelled`` of a tool that was never
started (EXTENSIONS §7).

The server is a stand-in that reads the head of ``POST /v1/jobs`` and then never reads its
body, so the interrupt lands in the upload, whatever the machine's speed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from stand_in_http import StandIn, serving

pytestmark = pytest.mark.timeout(120)

UPLOAD_STARTED = threading.Event()
RELEASE = threading.Event()


class StallingServer(StandIn):
    """Says it offers jobs, then takes a submission's head and stalls on its body."""

    def do_GET(self) -> None:
        self.send_json({"features": ["jobs"], "device": "cpu"})

    def do_POST(self) -> None:
        UPLOAD_STARTED.set()
        RELEASE.wait(60)  # the body stays unread: the client's upload blocks


def test_an_interrupt_while_the_inputs_are_sent_says_nothing_was_started(
    tmp_path: Path,
) -> None:
    (tmp_path / "data.bin").write_bytes(b"\0" * (32 << 20))  # more than the socket buffers
    with serving(StallingServer) as url:
        command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url,
                   "--send", "data.bin", "--", "-c", "print('ran')"]  # fmt: skip
        run = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert UPLOAD_STARTED.wait(60), "the submission never came"
            run.send_signal(signal.SIGINT)
            out, err = run.communicate(timeout=60)
        finally:
            RELEASE.set()
            if run.poll() is None:
                run.kill()
                run.wait()
    assert (run.returncode, out) == (130, b"")
    assert err == b"kcoral run: interrupted; nothing was started on the server\n"
