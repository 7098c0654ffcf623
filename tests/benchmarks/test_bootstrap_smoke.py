"""``benchmarks/bootstrap.py`` runs end to end and prints a row per size with both times
and their ratio (a smoke test, not a measurement: nothing about the numbers is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bootstrap.py"


def test_the_bootstrap_benchmark_prints_both_times_and_the_ratio_per_size(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "50", "200"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.lstrip().startswith(("50 ", "200 "))]
    assert len(rows) == 2 and all("ms" in row and "x |" in row for row in rows), done.stdout
