"""``benchmarks/gpu_device_run.sh`` and ``fetch_gpu_wheels.sh``: what can be checked without
a GPU machine (syntax, the device tool's limits the header promises, the ignored wheel folder).
The script itself ran here against a Python 3.12 venv without torch (its GPU tests skipped)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "gpu_device_run.sh"
FETCH = ROOT / "benchmarks" / "fetch_gpu_wheels.sh"


@pytest.mark.parametrize("script", [RUN, FETCH], ids=lambda p: p.name)
def test_the_scripts_are_valid_bash(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_header_names_the_exact_device_call_within_the_tools_limits() -> None:
    text = RUN.read_text()
    call = re.search(r'run\(command="([^"]+)", carry=\[([^\]]*)\], timeout_s=(\d+)\)', text)
    assert call is not None
    command, carry, timeout = call.group(1), call.group(2), int(call.group(3))
    assert command == "bash benchmarks/gpu_device_run.sh" and len(command) <= 2000
    assert carry == '".gpu-wheels"'
    budgets = {
        name: int(value)
        for name, value in re.findall(r"^(\w+_SECONDS)=\$\{\w+:-(\d+)\}$", text, re.MULTILINE)
    }
    assert set(budgets) == {"INSTALL_SECONDS", "PYTEST_SECONDS", "CHECK_SECONDS", "CORES_SECONDS"}
    assert sum(budgets.values()) <= 7 * 60 < timeout <= 600  # 7 minutes, one call, slack


def test_the_carried_wheel_folder_and_the_output_folder_are_ignored() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", ".gpu-wheels/x.whl", ".gpu-run/run.log"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert ignored.stdout.split() == [".gpu-wheels/x.whl", ".gpu-run/run.log"]


def test_at_most_eight_files_come_back_from_the_output_folder() -> None:
    written = set(re.findall(r'\$OUT_DIR/([\w.-]+)"', RUN.read_text()))
    assert written == {
        "run.log",
        "environment.txt",
        "pytest-gpu.xml",
        "gpu_check.json",
        "gpu_check.md",
        "back_to_back_cores.md",
        "server-logs.tar.gz",
        "summary.txt",
    }


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_finds_nothing() -> None:
    done = subprocess.run(["shellcheck", str(RUN), str(FETCH)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
