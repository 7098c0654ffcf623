"""``benchmarks/back_to_back_cores.py``: the back-to-back ratio on a chosen number of CPUs.

Timings are never asserted; only that a row per CPU count comes out with its verdict, and
that a count the machine does not have is refused before any server starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
