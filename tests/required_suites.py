"""The suites listed in ``tests/ci_required.txt``: in CI they must run, not skip."""

from __future__ import annotations

from pathlib import Path

REQUIRED_LIST = Path(__file__).with_name("ci_required.txt")


def required_prefixes() -> list[str]:
    """Node-id prefixes (test files or folders) that must not skip in CI."""
    lines = REQUIRED_LIST.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]
