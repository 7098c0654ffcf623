"""Smoke test of the performance harness: ``--quick`` runs every measure and prints the table.

Timings are never asserted (the machine is shared); only that each row and verdict exists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = (
    "trivial round trip, reused workers, p50",
    "trivial, fresh worker, spaced 100 ms, p50",
    "trivial, fresh worker, back to back",
    "worker start: spawn / preloaded fork",
    "bytes upload+return, cold",
    "bytes return, warm (cached)",
    "float32 tensor upload+return, cold",
    "8 concurrent client(s), 2 reused workers",
    "8-client rate / 1-client rate",
    "front-end CPU per trivial request",
    "front-end peak RSS",
    "raw loopback TCP / SHA-256 / memcpy",
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_quick_harness_prints_every_row_with_a_verdict_and_writes_json(tmp_path):
    out = tmp_path / "perf.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "perf.py"), "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    table = completed.stdout
    assert "| measure" in table and "verdict" in table
    assert "machine:" in table and "Python" in table
    for row in ROWS:
        assert row in table, row
    document = json.loads(out.read_text())
    verdicts = {row["measure"]: row["verdict"] for row in document["rows"]}
    assert all(v in {"PASS", "MISS", "info"} for v in verdicts.values())
    assert document["results"]["reused"]["concurrency_client"]
    assert document["results"]["worker_start"]["spawn_seconds"] > 0
    assert document["machine"]["logical_cpus"] >= 1
