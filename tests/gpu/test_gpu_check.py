"""``benchmarks/gpu_check.py --dry-run`` end to end against a CPU server it starts itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_the_dry_run_exercises_every_check_on_a_cpu_server(tmp_path: Path) -> None:
    report_path, table_path = tmp_path / "report.json", tmp_path / "table.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--json", str(report_path),
         "--markdown", str(table_path)],
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    assert report["dry_run"] is True
    rows = {row["name"]: row for row in report["rows"]}
    assert len(rows) == 12
    assert {row["status"] for row in rows.values()} <= {"PASS", "SKIP"}
    assert rows["tensor round trip, every dtype"]["status"] == "PASS"
    for row in rows.values():
        if row["status"] == "SKIP":
            assert row["detail"].startswith("dry run (CPU server, fake timings)")
    timing_rows = [row for row in rows.values() if row["environment"] is not None]
    assert len(timing_rows) == 6
    assert all(set(row["environment"]) == {"before", "after"} for row in timing_rows)
    assert all(row["clock"] for row in timing_rows)  # every timing row names its clock
    assert any("in-process CUDA events (3 %)" in name for name in rows)
    assert any(name.startswith("cupti-python") for name in rows)
    # EXTENSIONS §12: compare on two matmul variants, NVML readings (device-only rows)
    compared = next(row for name, row in rows.items() if name.startswith("compare: "))
    assert "'a @ b': 'ok', 'torch.mm': 'ok'" in compared["detail"]
    assert compared["data"]["comparison"]["kind"] == "kcoral.comparison"
    assert rows[next(n for n in rows if n.startswith("NVML readings"))]["status"] == "SKIP"
    # the printed table is the Markdown written to --markdown, ready for the README
    table = table_path.read_text()
    assert table in done.stdout
    lines = table.splitlines()
    assert "(dry run on a CPU server)" in lines[0]
    assert lines[2:4] == ["| check | status | clock | detail |", "| --- | --- | --- | --- |"]
    assert len(lines) == 4 + len(rows)
    assert all(line.startswith("| ") and line.endswith(" |") for line in lines[2:])


def test_missing_requirements_are_named_before_anything_starts(tmp_path: Path) -> None:
    # a stand-in `tornado` that cannot be found: the script must say what is missing
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import importlib.util, sys\n"
        "_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = (\n"
        "    lambda name, *a: None if name == 'tornado' else _find(name, *a)\n"
        ")\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "missing" in done.stderr and "tornado" in done.stderr
    assert "kcoral[server]" in done.stderr
