"""Plain-text router log lines: ``<timestamp> <LEVEL padded to 7> <event> k=v ...`` (§10)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Protocol, TextIO

from kcoral_server.storage.event_log import Listener, Listeners, escape_controls


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
    # repr escaped controls only in text with a space: a request's path (C1 controls, the
    # bytes 0x80-0x9F of a request line, are no spaces) went to the terminal as it came
    text = escape_controls(text)
    return text if len(text) <= 120 else text[:120] + "..."


class RouterLog:
    """Writes one line per event; a failing stream never fails a request."""

    def __init__(self, stream: TextIO | None = None, *, problems_only: bool = False) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._listeners = Listeners()
        #: write only WARNING and ERROR lines (a node's --no-log-console: its supervisor has
        #: no log file, so its problems are still said)
        self._problems_only = problems_only

    def add_listener(self, listener: Listener) -> None:
        """Have ``listener(event, fields)`` called with every line (``/metrics`` counts from
        them); what it raises is swallowed."""
        self._listeners.add(listener)

    def event(self, event: str, level: str = "INFO", **fields: Any) -> None:
        self._listeners.tell(event, fields)  # metrics never fail a request
        if self._problems_only and level == "INFO":
            return
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


class HasState(Protocol):
    state: str


class NodeStateLines:
    """The ``node_state`` lines (§10): called after each change of the node records, it logs
    every state that differs from the last it logged (a record it has not seen yet was
    ``initial``, as a record begins). So every change has its line, whatever made it: a
    status, the first status of a new stream, a stream that ended or went stale. The
    gateway had logged only the changes a later status made, so a drained node's ``left``, a
    lost node's ``unhealthy`` and every node's ``ready`` after a router restart had none."""

    def __init__(self, log: RouterLog, initial: str) -> None:
        self.log = log
        self.initial = initial
        self.logged: dict[str, str] = {}

    def __call__(self, nodes: Mapping[str, HasState]) -> None:
        for node_id, node in nodes.items():
            previous = self.logged.get(node_id, self.initial)
            if node.state != previous:
                self.logged[node_id] = node.state
                self.log.event("node_state", node=node_id, state=node.state, previous=previous)
        if len(self.logged) > len(nodes):  # a forgotten record: one made again begins anew
            for node_id in [n for n in self.logged if n not in nodes]:
                del self.logged[node_id]


class OncePerPeer:
    """Says whether a line about a gRPC peer is due: at most one per peer address (its port
    left out: each retry comes from a new one) per ``window`` seconds. A node with a wrong
    token retries every stream with back-off forever; one line a minute names it without
    flooding the log. Bounded, so many addresses cannot make it grow without end."""

    MAX_PEERS = 4096

    def __init__(self, window: float, clock: Any = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self.last: dict[str, float] = {}

    def due(self, peer: str) -> bool:
        address = peer.rsplit(":", 1)[0] if peer.count(":") > 1 else peer
        now = self.clock()
        last = self.last.get(address)
        if last is not None and now - last < self.window:
            return False
        if len(self.last) >= self.MAX_PEERS:
            self.last = {a: t for a, t in self.last.items() if now - t < self.window}
            if len(self.last) >= self.MAX_PEERS:
                return False  # so many addresses at once: those already named stand for them
        self.last[address] = now
        return True
