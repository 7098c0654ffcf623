"""A node whose router is out of reach says so once per slot, not on every retry: each of a
one-seat node's five slots logged a WARNING ``tunnel_disconnected`` on each attempt, which
flooded an operator's terminal (flags soak). Now a slot says its first failure in a row and
then every 16th, with the count. ``Tunnel.run_slot`` against a router that never answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kcoral_server.node import tunnel as tunnel_module
from kcoral_server.node.tunnel import Tunnel


class Recorder:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def emit(self, event: str, level: str = "INFO", **fields: Any) -> None:
        self.records.append((event, level, fields))


class Unreachable:
    """A slot call to a router that refuses every connection."""

    async def write(self, frame: Any) -> None:
        raise OSError("connection refused")

    def cancel(self) -> None:
        pass


def test_a_slot_says_its_first_failure_in_a_row_then_every_16th(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tunnel_module, "MIN_DELAY", 0.001)
    monkeypatch.setattr(tunnel_module, "MAX_DELAY", 0.002)

    async def scenario() -> list[tuple[str, str, dict[str, Any]]]:
        log = Recorder()
        tunnel = Tunnel("http://127.0.0.1:1", "n", None, "instance", "http://127.0.0.1:2", 1, log)
        attempts = 0

        def connect_slot(**_: Any) -> Unreachable:
            nonlocal attempts
            attempts += 1
            if attempts == 40:
                tunnel.closing = True  # the node stops: the slot's loop ends
            return Unreachable()

        tunnel.connect_slot = connect_slot  # type: ignore[assignment]
        await asyncio.wait_for(tunnel.run_slot(0), 30)
        await tunnel.channel.close()
        return log.records

    records = asyncio.run(scenario())
    said = [fields for event, _, fields in records if event == "tunnel_disconnected"]
    assert [fields.get("failures_in_a_row", 1) for fields in said] == [1, 17, 33]
    assert {level for event, level, _ in records if event == "tunnel_disconnected"} == {"WARNING"}
    assert said[0]["error"] == "connection refused"
