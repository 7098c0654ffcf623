"""Raw-HTTP helpers for the sandbox and limits tests (over ``tests/raw_http.py``).

test_sandbox imports this module INSIDE a sandbox where only this folder is mounted (a
read-only path), so it must import on its own: ``raw_http`` is imported where it is used.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def execute(
    url: str, program: dict, blobs: dict[str, bytes] | None = None, timeout: float = 90.0
) -> tuple[int, Any, dict[str, bytes]]:
    """POST /execute; returns (status, decoded result JSON, binary parts)."""
    from raw_http import post_execute

    answer = post_execute(url, program, blobs, timeout=timeout)
    if answer.body is None and answer.raw and not answer.parts:
        return answer.status, json.loads(answer.raw), {}  # JSON under another content type
    return answer.status, answer.body, answer.parts


def run_source(source: str, function: str = "main", args: list | None = None) -> dict:
    """A program that uploads ``source``, runs ``function(*args)`` and returns its value."""
    from raw_http import call_program

    return call_program(source, function, args)
