"""``benchmarks/back_to_back_cores.py``: the back-to-back ratio on a chosen number of CPUs.

Timings are never asserted; only that a row per CPU count comes out with its verdict, that
a count the machine does not have is refused before any server starts, and that a SIGTERM
stops the servers it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "back_to_back_cores.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_cpu_gives_one_row_with_its_ratio_and_verdict(tmp_path: Path) -> None:
    out = tmp_path / "cores.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpus", "1", "--requests", "6", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "| CPUs | reused p50 | back to back p50 | ratio |" in completed.stdout
    (row,) = json.loads(out.read_text())
    assert row["cpus"] == 1
    assert row["verdict"] in {"PASS", "MISS"}
    assert row["ratio"] == pytest.approx(row["back_to_back_p50_ms"] / row["reused_p50_ms"])


def test_more_cpus_than_this_process_may_use_is_refused_before_anything_starts() -> None:
    too_many = len(os.sched_getaffinity(0)) + 1
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpus", f"1,{too_many}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert f"this process may use {too_many - 1} CPUs" in completed.stderr
    assert "reused p50" not in completed.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sigterm_mid_run_stops_the_servers_it_started() -> None:
    """The device script's ``timeout`` ends an overlong run with SIGTERM; the servers it
    started must not outlive it."""
    run = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--cpus", "1", "--requests", "100000"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    servers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while len(servers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            servers = [
                child for child in psutil.Process(run.pid).children() if "server" in child.cmdline()
            ]
        assert len(servers) == 2, "both servers should have started"
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 124
        _gone, alive = psutil.wait_procs(servers, timeout=10)
        assert alive == []
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for server in servers:  # what a failure left behind
            with contextlib.suppress(psutil.NoSuchProcess):
                server.kill()
