"""The benchmarks' helper scripts (``perf.py`` runs them with their arguments) answer
``--help`` with their usage: they read it as an argument, so ``perf_ray.py`` and
``perf_workers.py`` ended in a traceback, ``client_transports.py`` too, and
``perf_echo_server.py --help`` started a server that wrote its URL to a file named
``--help`` in the caller's folder and never returned."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize(
    "script", ["perf_ray.py", "perf_workers.py", "client_transports.py", "perf_echo_server.py"]
)
def test_a_helper_script_answers_help_with_its_usage_and_leaves_nothing(
    script: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("usage: ") and "Traceback" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []
