"""Waiting in a test for something another process does (a module name unique across the
test tree, so plain ``import`` finds it from any folder)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 20.0) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (asked every 50 ms; a
    hang guard, not a timing check)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
