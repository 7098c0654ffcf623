"""``benchmarks/session_cells.py --quick`` runs end to end and prints its rows (a smoke
test, not a measurement: nothing about the numbers is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "session_cells.py"


@pytest.mark.timeout(400)
def test_the_session_cells_benchmark_prints_the_magic_and_client_rows(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--import-module", "asyncio"],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for row in (
        "session cell after `import asyncio`: queue",
        "session cell through %%kcoral: wall",
        "same program through Session.execute: wall",
        "magic / client (wall)",
    ):
        assert row in done.stdout, done.stdout
