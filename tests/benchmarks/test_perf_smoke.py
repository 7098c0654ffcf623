"""Smoke test of the performance harness: ``--quick`` runs every measure and prints the table.

Timings are never asserted (the machine is shared); only that each row and verdict exists.
Quick mode measures the default-flags configuration only and leaves Ray out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = (
    "sandbox (resolved, /v1/info)",
    "trivial round trip, reused workers, p50",
    "trivial, fresh worker, spaced 100 ms, p50",
    "trivial, reused worker, spaced 100 ms, p50",
    "torch cell, fresh worker, spaced 100 ms, p50",
    "trivial, fresh worker, back to back",
    "worker start: spawn / preloaded fork",
    "bytes upload+return, cold",
    "bytes return, warm (cached)",
    "float32 tensor upload+return, cold",
    "8 concurrent client processes, 2 reused workers",
    "8-process rate / 1-process rate",
    "front-end CPU per trivial request",
    "worker CPU per trivial request",
    "front-end peak RSS",
    "Ray actor call round trip, p50 (peer)",
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
    assert "| configuration" in table and "verdict" in table
    assert "machine:" in table and "Python" in table and "load average" in table
    for row in ROWS:
        assert row in table, row
    document = json.loads(out.read_text())
    rows = document["rows"]
    assert all(row["verdict"] in {"PASS", "MISS", "info"} for row in rows)
    assert {row["configuration"] for row in rows} == {"default flags", "machine"}
    measured = document["results"]["configurations"]["default flags"]
    assert measured["sandbox"] in {"bubblewrap", "none"}
    assert measured["reused"]["worker_cpu_seconds_per_request"] >= 0  # 10 ms clock ticks
    assert set(measured["reused"]["concurrency_rates"]) == {"1", "2", "4", "8"}
    assert "skipped" in document["results"]["ray"]
    assert document["results"]["worker_start"]["spawn_seconds"] > 0
    assert document["machine"]["logical_cpus"] >= 1
    assert len(document["machine"]["load_average_end"]) == 3
