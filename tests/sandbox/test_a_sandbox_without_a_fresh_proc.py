"""Where bubblewrap may make namespaces but not mount a fresh ``/proc`` (a container whose
runtime masks paths of its ``/proc``: the Kubernetes node pod without ``procMount:
Unmasked``, docs/scaling.md "The node pod's sandbox"), the start-up probe says so (SERVER
§14). Before, the probe built namespaces only: it passed there, every worker then failed
with ``Can't mount proc on /newroot/proc``, and a node's supervisor restarted its server
for ever saying "no worker could be started", where the docs promise exit 2 and the reason.

The place is staged with bubblewrap itself: inside an outer ``bwrap`` (root read-only, its
own ``/proc``), a nested one's fresh procfs is refused by the same kernel check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kcoral_server.processes import sandbox

#: a hang guard, not a timing check: the refusal comes before any worker starts
START_SECONDS = 120.0
BWRAP_PROBLEM = sandbox.probe()
OUTER = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]


def _fresh_proc_refused_inside_bwrap() -> bool:
    if BWRAP_PROBLEM is not None:
        return False
    nested = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    done = subprocess.run([*OUTER, "--", *nested], capture_output=True, timeout=60, check=False)
    return done.returncode != 0 and b"Can't mount proc" in done.stderr


pytestmark = [
    pytest.mark.skipif(
        BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
    ),
    pytest.mark.skipif(
        BWRAP_PROBLEM is None and not _fresh_proc_refused_inside_bwrap(),
        reason="here a bwrap inside bwrap may mount a fresh /proc: the refusal cannot be staged",
    ),
]


def test_the_probe_names_a_proc_that_the_sandbox_cannot_mount() -> None:
    probe = "from kcoral_server.processes import sandbox; print(sandbox.probe())"
    done = subprocess.run(
        [*OUTER, "--", sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=START_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Can't mount proc on /newroot/proc" in done.stdout


def test_a_node_whose_sandbox_cannot_mount_proc_exits_2_saying_why(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kcoral", "server", "--sandbox", "bubblewrap"]
    command += ["--device", "cpu", "--host", "127.0.0.1", "--port", "0"]
    command += ["--log-dir", str(tmp_path / "logs"), "--disk-cache-dir", str(tmp_path / "cache")]
    env = {key: value for key, value in os.environ.items() if not key.startswith("KCORAL_")}
    env["TMPDIR"] = str(tmp_path)
    place = [*OUTER, "--bind", str(tmp_path), str(tmp_path), "--chdir", str(tmp_path), "--"]
    done = subprocess.run(
        [*place, *command],
        capture_output=True,
        text=True,
        timeout=START_SECONDS,
        env=env,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "kcoral server: --sandbox bubblewrap cannot run here: "
        "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"
    )
