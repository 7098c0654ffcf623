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
import signal
import threading
from collections.abc import Callable, Iterator
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


def cancelled_while_it_waits(
    session: Session, tmp_path: Path, cancel: Callable[[kcoral.Job], object]
) -> kcoral.Job:
    """A job of ``session`` that ``cancel`` ended while it waited for the worker's clean-up;
    the session then still holds the first program's state and runs the next program."""
    session.execute(module_program(REMEMBER, "remember", 1))
    with cleaning_up(session, tmp_path):
        job = session.submit(module_program(REMEMBER, "remember", 2))
        cancel(job)
        # ended while the clean-up still runs: the wait was cut short
        wait_for(lambda: job.status()["status"] == "CANCELLED", "the job cancelled")
        assert job.status()["started_at"] is None
    # the cancelled program never ran: the state is the first program's
    assert session.execute(module_program(REMEMBER, "remember", 3)).results["r"] == 1
    assert session.info()["state"] == "IDLE"
    return job


def test_an_interrupt_while_the_program_waits_for_the_clean_up_cancels_it_and_keeps_the_state(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory("--max-sessions", "1")
    with kcoral.Client(server.url) as client, client.session() as session:
        job = cancelled_while_it_waits(session, tmp_path, lambda _: session.interrupt())
        assert job.status()["error_kind"] == "cancelled"
        with pytest.raises(kcoral.KCoralError) as refused:
            job.result(timeout=30)
        assert refused.value.status_code == 409
        assert refused.value.message == f"the job was cancelled: {NOT_STARTED}"


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
    # before: it ran once the clean-up ended and was killed there, ending the session
    server = server_factory("--max-sessions", "1")
    with kcoral.Client(server.url) as client, client.session() as session:
        cancelled_while_it_waits(session, tmp_path, kcoral.Job.cancel)


def bump() -> int:
    import kcoral.session as state

    state.namespace["v"] = state.namespace.get("v", 0) + 1
    return state.namespace["v"]


def test_a_remote_call_interrupted_before_it_starts_never_runs_and_the_session_stays(
    server_factory, tmp_path: Path
) -> None:
    # Ctrl-C while a session's remote function waits to start: before, it ran once the
    # clean-up ended, was killed there as its client had gone, and the session ended
    server = server_factory("--max-sessions", "1")
    with kcoral.Client(server.url) as client, client.session() as session:
        remote_bump = session.function()(bump)
        assert remote_bump.remote() == 1
        with cleaning_up(session, tmp_path):
            before, main = accepted(server), threading.get_ident()

            def interrupt_once_accepted() -> None:
                wait_for(lambda: accepted(server) > before, "the call accepted")
                signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, in the caller's thread

            interrupter = threading.Thread(target=interrupt_once_accepted)
            interrupter.start()
            with pytest.raises(KeyboardInterrupt, match=r"the remote call bump\(\) on .* was"):
                remote_bump.remote()
            interrupter.join()
        assert remote_bump.remote() == 2  # the interrupted call never ran
        assert session.info()["state"] == "IDLE"
