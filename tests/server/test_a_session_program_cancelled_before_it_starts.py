"""A session's program cancelled before it starts never runs, and the session keeps its
state (EXTENSIONS §11, Interrupts): an interrupt, its job's ``DELETE`` or its client going
away while it waits for the worker's clean-up after the previous program. Found in a real
kernel: the interrupt found no running program, so the waiting one ran once the clean-up
ended, while its cell said it was interrupted. Real CPU server; the previous program
leaves garbage whose collection (the worker's clean-up, SERVER §6) waits for a file the
test writes, so the next program waits to start for as long as the test needs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

import kcoral
from kcoral.client_sessions import Session

pytestmark = pytest.mark.timeout(180)

REMEMBER = (
    "import kcoral.session as s\ndef remember(v):\n    before = s.namespace.get('v')\n"
    "    s.namespace['v'] = v\n    return before\n"
)
# A cycle only the worker's clean-up collects (automatic collection off), whose finaliser
# says it began and waits for ``go``: the clean-up, and so the next program's start, waits.
SLOW_CLEAN_UP = (
    "import gc, os, time\n"
    "class Garbage:\n"
    "    def __del__(self):\n"
    "        open(self.held, 'w').close()\n"
    "        deadline = time.monotonic() + 60\n"
    "        while not os.path.exists(self.go) and time.monotonic() < deadline:\n"
    "            time.sleep(0.01)\n"
    "def leave_garbage(held, go):\n"
    "    gc.disable()\n"
    "    garbage = Garbage()\n"
    "    garbage.held, garbage.go, garbage.me = held, go, garbage\n"
)
NOT_STARTED = "interrupted before it started: the program never ran; the session keeps its state"


def module_program(source: str, name: str, *args: object) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    value = program.run(fn=program.get_function(module=module, name=name, id="fn"), args=list(args))
    program.return_(key="r", value=value)
    return program


@contextlib.contextmanager
def cleaning_up(session: Session, tmp_path: Path) -> Iterator[Path]:
    """The session's worker cleaning up after a program until the block ends; yields the
    file that ends it early."""
    held, go = tmp_path / "held", tmp_path / "go"
    session.execute(module_program(SLOW_CLEAN_UP, "leave_garbage", str(held), str(go)))
    wait_for(held.exists, "the worker's clean-up to begin")
    try:
        yield go
    finally:
        go.touch()


def accepted(server) -> int:
    return sum(1 for e in server.events() if e.get("event") == "request_accepted")


def test_an_interrupt_while_the_program_waits_for_the_clean_up_cancels_it_and_keeps_the_state(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory("--max-sessions", "1")
    with kcoral.Client(server.url) as client, client.session() as session:
        session.execute(module_program(REMEMBER, "remember", 1))
        with cleaning_up(session, tmp_path):
            job = session.submit(module_program(REMEMBER, "remember", 2))
            session.interrupt()
            # answered while the clean-up still runs: the wait was cut short
            wait_for(lambda: job.status()["status"] == "CANCELLED", "the job cancelled")
            state = job.status()
            assert state["started_at"] is None and state["error_kind"] == "cancelled", state
            with pytest.raises(kcoral.KCoralError) as refused:
                job.result(timeout=30)
            assert refused.value.status_code == 409
            assert refused.value.message == f"the job was cancelled: {NOT_STARTED}"
        # the cancelled program never ran: the state is the first program's
        assert session.execute(module_program(REMEMBER, "remember", 3)).results["r"] == 1
        assert session.info()["state"] == "IDLE"


def test_a_program_whose_client_leaves_before_it_starts_never_runs_and_the_session_stays(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory("--max-sessions", "1")

    async def cancelled_before_it_starts(session_id: str) -> None:
        async with kcoral.AsyncClient(server.url) as client:
            session = await client.attach_session(session_id)
            before = accepted(server)
            call = asyncio.ensure_future(session.execute(module_program(REMEMBER, "remember", 2)))
            await asyncio.to_thread(wait_for, lambda: accepted(server) > before, "it accepted")
            call.cancel()  # its connection is cut: the server sees its client leave
            with contextlib.suppress(asyncio.CancelledError):
                await call

    with kcoral.Client(server.url) as client, client.session() as session:
        session.execute(module_program(REMEMBER, "remember", 1))
        with cleaning_up(session, tmp_path):
            asyncio.run(cancelled_before_it_starts(session.id))
            wait_for(
                lambda: any(
                    e.get("finish_reason") == "client_disconnected" for e in server.events()
                ),
                "the program to end as its client left",
            )
        # before: it waited for the clean-up, ignoring that its client had left
        assert session.execute(module_program(REMEMBER, "remember", 3)).results["r"] == 1
        assert session.info()["state"] == "IDLE"


def test_a_session_job_cancelled_before_it_starts_never_runs_and_the_session_stays(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory("--max-sessions", "1")
    with kcoral.Client(server.url) as client, client.session() as session:
        session.execute(module_program(REMEMBER, "remember", 1))
        with cleaning_up(session, tmp_path):
            job = session.submit(module_program(REMEMBER, "remember", 2))
            job.cancel()
            wait_for(lambda: job.status()["status"] == "CANCELLED", "the job cancelled")
            assert job.status()["started_at"] is None
        assert session.execute(module_program(REMEMBER, "remember", 3)).results["r"] == 1
        assert session.info()["state"] == "IDLE"
