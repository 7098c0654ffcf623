"""``benchmarks/first_cells.py`` runs end to end on a server started as the README starts
one and prints its table (a smoke test, not a measurement: nothing about the numbers is
asserted), and refuses counts that measure nothing before it starts any server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "first_cells.py"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_first_cells_benchmark_prints_each_cell_against_the_steady_one(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "1", "--cells", "2", "--steady", "2"],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for row in ("| cell | this tree ms (÷ steady) |", "| 1 | ", "| 2 | ", "| steady | "):
        assert row in done.stdout, done.stdout
    assert "server start to ready (median): this tree" in done.stdout


@pytest.mark.parametrize("arguments", [["--cells", "0"], ["--gap", "-1"], ["--rounds", "0"]])
def test_the_first_cells_benchmark_refuses_counts_that_measure_nothing(arguments) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "must be at least 1" in done.stderr
