"""CI runs everything it can: the list of suites that must not skip there names real files,
and the permission tests that skip under root run again without root's privileges."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from file_permissions import MARKER, bypasses_file_permissions
from required_suites import required_prefixes

ROOT = Path(__file__).resolve().parents[1]


def test_every_suite_that_must_not_skip_in_ci_exists() -> None:
    missing = [prefix for prefix in required_prefixes() if not (ROOT / prefix).exists()]
    assert not missing


@pytest.mark.skipif(
    not bypasses_file_permissions(),
    reason="this process obeys file permissions: the permission tests ran directly",
)
def test_permission_checks_run_again_without_the_privilege_to_bypass_them(tmp_path) -> None:
    capsh = shutil.which("capsh")
    assert capsh, "capsh (Debian's libcap2-bin) is needed to drop CAP_DAC_OVERRIDE"
    command = [
        capsh,
        "--drop=cap_dac_override,cap_dac_read_search",
        "--",
        "-c",
        'exec "$@"',
        "sh",
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        MARKER,
        "--basetemp",
        str(tmp_path / "run"),
        "tests",
    ]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary
