"""A session ended while its program's answer is still being put together stays ended.

``DELETE /v1/sessions/<id>`` (or the server's shutdown) cancels the running program; once the
worker has sent the program's outcome the cancel can no longer stop it, and the seat's
release came afterwards and made the session ``IDLE`` again: its worker kept its seat and
memory and took the next program, while its owner had been told it ended (the jobs and
sessions audit reproduced it against a real server whose output reading was slowed). These
tests drive that order on a real ``Session`` with the registry's two hooks recorded.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kcoral_server.sessions.registry import Session


class Registry:
    """What a ``Session`` asks of its registry: events, and retiring its worker."""

    def __init__(self) -> None:
        self.retired: list[Session] = []
        self.events = SimpleNamespace(emit=lambda *args, **fields: None)

    def retire(self, session: Session) -> None:
        self.retired.append(session)
        session.seat.worker = None


class Program:
    def __init__(self) -> None:
        self.request_id = "program-1"
        self.observer = None  # a plain program: no job (sessions.end_reasons.program_name)
        self.cancelled: list[str] = []

    def cancel(self, reason: str, answer: object = None) -> None:
        self.cancelled.append(reason)  # too late: the worker already answered


def running_session() -> tuple[Session, Registry, Program]:
    registry = Registry()
    session = Session(registry, "alice", [], 600.0)  # type: ignore[arg-type]
    session.seat.worker = SimpleNamespace(pid=4242, gone=None, returncode=None)  # type: ignore[assignment]
    session.state = "RUNNING"
    program = Program()
    session.running = program  # type: ignore[assignment]
    return session, registry, program


def test_a_session_deleted_as_its_program_finishes_stays_ended_and_its_worker_retires() -> None:
    async def scenario() -> dict[str, Any]:
        session, registry, program = running_session()
        session.end("deleted", "session ended: deleted by its owner")
        assert program.cancelled == ["cancelled"] and registry.retired == []
        session._released(None)  # the program's release, after its outcome
        await asyncio.sleep(0)
        return {
            "state": session.state,
            "reason": session.end_reason,
            "retired": registry.retired == [session],
            "worker": session.seat.worker,
            "running": session.running,
        }

    assert asyncio.run(scenario()) == {
        "state": "ENDED",
        "reason": "deleted",
        "retired": True,
        "worker": None,
        "running": None,
    }


def test_a_session_not_ended_is_idle_again_after_its_program() -> None:
    async def scenario() -> tuple[str, list[Session]]:
        session, registry, _program = running_session()
        session._released(None)
        state = session.state
        if session._settling is not None:
            session._settling.cancel()
        return state, registry.retired

    assert asyncio.run(scenario()) == ("IDLE", [])
