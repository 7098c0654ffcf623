"""The type checker is part of the test command (issue 30.7).

``mypy`` with no arguments checks what ``[tool.mypy]`` in pyproject.toml names: the public
client package ``kcoral`` strictly, ``kcoral_server`` and ``kcoral_jupyter`` in mypy's default
mode with the bodies of unannotated functions checked. It runs here so that every place the
test command runs (a developer's ``pytest``, CI's ``.ci/run``) runs it too, and its report
is the failure message.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# A cold run (no .mypy_cache) takes about a minute on two busy cores, warm ones a few seconds.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_type_checker_is_clean() -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    report = checked.stdout + checked.stderr
    assert checked.returncode == 0, f"mypy found problems (run `mypy` to see them):\n{report}"
