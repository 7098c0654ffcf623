"""The protocol layer's own exceptions; it depends on nothing else in ``kcoral``.

``kcoral.errors`` re-exports both names: uploaded code imports
``kcoral.errors.ExecutionError`` (PROTOCOL.md §7.6), and the client's callers catch
``kcoral.errors.ValidationError``.
"""

from __future__ import annotations

#: The eight instruction error kinds of PROTOCOL.md §7.6.
INSTRUCTION_ERROR_KINDS = frozenset(
    {
        "parse",
        "compile",
        "runtime",
        "correctness",
        "gpu_access",
        "serialization",
        "unavailable",
        "engine",
    }
)


class ValidationError(ValueError):
    """A program, path or value that breaks the protocol's rules."""


class ExecutionError(Exception):
    """Raised by uploaded code to fail the running instruction with ``kind`` and ``message``."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in INSTRUCTION_ERROR_KINDS:
            raise ValueError(
                f"unknown error kind {kind!r}; expected one of {sorted(INSTRUCTION_ERROR_KINDS)}"
            )
        super().__init__(kind, message)
        self.kind = kind
        self.message = message

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"
