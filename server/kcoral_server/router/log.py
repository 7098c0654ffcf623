"""Plain-text router log lines: ``<timestamp> <LEVEL padded to 7> <event> k=v ...`` (§10)."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from kcoral_server.storage.event_log import Listener, Listeners


def format_value(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.1f}"
    elif isinstance(value, (list, tuple, dict)):
        # JSON, as the server's events: ["bob"], not Python's ['bob'].
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=repr)
    else:
        text = str(value)
    if any(ch.isspace() for ch in text) or text == "":
        text = repr(text)
    return text if len(text) <= 120 else text[:120] + "..."


class RouterLog:
    """Writes one line per event; a failing stream never fails a request."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._listeners = Listeners()

    def add_listener(self, listener: Listener) -> None:
        """Have ``listener(event, fields)`` called with every line (``/metrics`` counts from
        them); what it raises is swallowed."""
        self._listeners.add(listener)

    def event(self, event: str, level: str = "INFO", **fields: Any) -> None:
        self._listeners.tell(event, fields)  # metrics never fail a request
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
