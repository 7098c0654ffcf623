"""A ``--ready-file`` that cannot be written is a usage error before anything starts.

The URL is written only once the server (or router) listens; a ready file naming a folder,
or in a folder that does not exist, used to end both commands there with a traceback
(exit 1), after the server had started its workers and said it was listening, and left a
``.NAME.tmp`` beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN_SECONDS = 120.0


def run_kcoral(command: str, ready_file: Path, directory: Path) -> subprocess.CompletedProcess:
    """``kcoral COMMAND --port 0 --ready-file READY_FILE`` with its default flags otherwise,
    run to its end in ``directory``."""
    argv = [sys.executable, "-m", "kcoral", command, "--port", "0", "--ready-file", str(ready_file)]
    if command == "server":
        argv += ["--log-dir", str(directory / "logs")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    return subprocess.run(
        argv, cwd=directory, env=env, capture_output=True, text=True, timeout=RUN_SECONDS
    )


@pytest.mark.parametrize("command", ["server", "router"])
@pytest.mark.parametrize(
    ("where", "problem"),
    [("folder", "{path} is a folder"), ("missing/ready", "{path}: no folder {parent}")],
    ids=["a-folder", "in-a-missing-folder"],
)
def test_a_ready_file_that_cannot_be_written_is_refused_in_one_line_before_start_up(
    tmp_path: Path, command: str, where: str, problem: str
) -> None:
    (tmp_path / "folder").mkdir()
    ready_file = tmp_path / where
    result = run_kcoral(command, ready_file, tmp_path)
    assert result.returncode == 2, result.stderr
    said = problem.format(path=ready_file, parent=ready_file.parent)
    assert f"kcoral {command}: error: --ready-file {said}\n" in result.stderr
    assert "Traceback" not in result.stderr
    assert "listening" not in result.stderr + result.stdout
    assert not (tmp_path / "logs").exists()  # nothing started: no run folder either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]
