"""A ``--sandbox-readonly-path`` the sandbox cannot show is refused before anything starts.

A path that did not exist was left out of every sandbox without a word (a typo left the
programs without their data); one under ``/dev/shm`` failed with exit 1 after the server
had logged ``server_started`` and made its run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN_SECONDS = 120.0


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("missing", "--sandbox-readonly-path {path} does not exist"),
        ("/dev/shm", "--sandbox-readonly-path '/dev/shm' lies under /dev/shm"),
    ],
    ids=["missing", "dev-shm"],
)
def test_a_readonly_path_the_sandbox_cannot_show_exits_2_before_start_up(
    tmp_path: Path, path: str, message: str
) -> None:
    shown = tmp_path / path if path == "missing" else Path(path)
    argv = [sys.executable, "-m", "kcoral", "server", "--port", "0"]
    argv += ["--log-dir", str(tmp_path / "logs"), "--sandbox-readonly-path", str(shown)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_SECONDS
    )
    assert result.returncode == 2, result.stderr
    assert f"kcoral server: error: {message.format(path=shown)}" in result.stderr
    assert "server_started" not in result.stderr
    assert not (tmp_path / "logs").exists()
