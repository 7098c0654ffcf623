"""Waiting in a test for something another process does (a module name unique across the
test tree, so plain ``import`` finds it from any folder)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], object], timeout: float = 20.0) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (asked every 50 ms; a
    hang guard, not a timing check)."""
    return bool(_first_true(predicate, timeout, 0.05))


def wait_for(
    predicate: Callable[[], T],
    what: str,
    timeout: float = 20.0,
    detail: Callable[[], str] | None = None,
    every: float = 0.05,
) -> T:
    """``predicate()``'s first true value within ``timeout`` seconds (asked ``every`` so
    often: longer where one question costs a process; a hang guard, not a timing check);
    else ``AssertionError`` naming ``what``, with ``detail()`` below it where given (what
    shows why: a process's log)."""
    value = _first_true(predicate, timeout, every)
    if not value:
        message = f"timed out after {timeout:g} s waiting for: {what}"
        raise AssertionError(f"{message}\n{detail()}" if detail is not None else message)
    return value


def wait_for_file(path: Path, timeout: float = 20.0) -> str:
    """``path``'s text once it exists (a marker a program writes), within ``timeout``
    seconds; else ``AssertionError`` naming the file."""
    wait_for(path.exists, f"{path} to appear", timeout)
    return path.read_text()


def _first_true(predicate: Callable[[], T], timeout: float, every: float) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()
