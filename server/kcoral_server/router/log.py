"""Plain-text router log lines: ``<timestamp> <LEVEL padded to 7> <event> k=v ...`` (§10)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TextIO


def format_value(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.1f}"
    else:
        text = str(value)
    if any(ch.isspace() for ch in text) or text == "":
        text = repr(text)
    return text if len(text) <= 120 else text[:120] + "..."


class RouterLog:
    """Writes one line per event; a failing stream never fails a request."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._listeners: list[Callable[[str, dict[str, Any]], None]] = []

    def add_listener(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Have ``listener(event, fields)`` called with every line (``/metrics`` counts from
        them); what it raises is swallowed."""
        self._listeners.append(listener)

    def event(self, event: str, level: str = "INFO", **fields: Any) -> None:
        for listener in self._listeners:
            try:
                listener(event, fields)
            except Exception:
                pass  # metrics never fail a request
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        parts = [stamp, f"{level:<7}", event]
        parts.extend(
            f"{key}={format_value(value)}" for key, value in fields.items() if value is not None
        )
        try:
            self._stream.write(" ".join(parts) + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass
