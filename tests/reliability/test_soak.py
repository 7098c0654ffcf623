"""The shortened soak (``benchmarks/soak.py --requests 400``) as a test: every answer is the
one its kind must have, and resources at the end are back within their bounds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SOAK_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("kcoral_soak_benchmark", SOAK_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_a_short_soak_answers_every_request_as_expected_and_leaks_nothing(tmp_path) -> None:
    soak = load_soak()
    report = soak.run_soak(requests=400, clients=16, workers=2, directory=tmp_path)
    print(soak.format_report(report))
    assert report.unexpected == {}, report.outcomes
    assert report.transport_errors == 0
    assert sum(report.outcomes.values()) == 400
    assert report.outcomes.get("504 timeout", 0) == 4  # 1 % of the mix
    assert report.end.workspaces == 0
    assert report.end.processes == report.start.processes
    assert report.end.fds <= report.start.fds + soak.FD_SLACK
    assert report.bounded and report.ok
