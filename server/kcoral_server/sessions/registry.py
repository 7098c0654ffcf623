"""Sessions: one worker pinned to one owner across several programs (EXTENSIONS §11).

A session's seat (``session/<8 hex>``) is not one of the pool's stateless seats: it never
takes stateless work and stateless work never waits for it. Its worker is a reused worker
(SERVER §6 puts the environment and torch settings back after each program) whose Python
state, ``kcoral.session.namespace`` included, survives from one program to the next. Its
worker is built for the session's GPU set (one or more GPUs, pinned at creation); each
program takes the lease on that whole set for itself alone, exactly as a stateless one
takes it on its GPU or its set (``SeatRun``), and gives it back at its end;
the pool hands the seat back to the session (``Seat.pinned``), which keeps the worker or,
when the pool decided to retire it (timeout, crash, leftover work), ends the session with a
reason that the next program gets as ``410 session_ended``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kcoral.protocol.schema import Options
from kcoral_server.execution.responses import Refusal, RequestFailed
from kcoral_server.pool.queue import NoWorker
from kcoral_server.pool.retirement import reason_to_retire
from kcoral_server.pool.seat import Seat, SeatState
from kcoral_server.processes import ipc, procfs
from kcoral_server.sessions.end_reasons import (
    END_REASONS,
    INTERRUPT_GRACE_SECONDS,
    NOT_STARTED,
    ended_under,
    exited_message,
    idle_message,
    not_stopped_message,
    program_name,
    retired_end,
)
from kcoral_server.sessions.seat_shares import SeatRules, per_identity_cap

if TYPE_CHECKING:
    from kcoral_server.execution.pipeline import ExecuteRequest
    from kcoral_server.front_door.app import ServerState
    from kcoral_server.front_door.callers import Identity
    from kcoral_server.processes.handle import WorkerHandle
    from kcoral_server.processes.launch import SeatSandbox

#: a program sent while another of the session runs (EXTENSIONS §11)
BUSY = Refusal(409, "session_busy", "another program of this session is running", "rejected")
#: how often an interrupt that came before its program started looks whether it has
START_POLL_SECONDS = 0.005
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class Session:
    """One session: its seat, its owner and where it is in its life."""

    def __init__(
        self, registry: Sessions, owner: str, gpu_ids: list[int], idle_timeout: float
    ) -> None:
        self.registry = registry
        self.id = str(uuid.uuid4())
        self.owner = owner
        #: the GPUs pinned to the session, in the order its programs see them (empty: CPU)
        self.gpu_ids = list(gpu_ids)
        self.idle_timeout = idle_timeout
        #: the creator asked for ``idle_timeout`` (else it is --session-idle-seconds)
        self.idle_asked = False
        seat_id = f"session/{self.id.replace('-', '')[:8]}"
        self.seat = Seat(seat_id, self.gpu_ids[0] if self.gpu_ids else None)
        self.seat.pinned = self._released
        self.state = "STARTING"
        self.created_at = time.time()
        self.last_finished_at: float | None = None
        self.programs = 0
        self.end_reason: str | None = None
        self.end_message: str | None = None
        self.ended_at: float | None = None
        self.running: ExecuteRequest | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._settling: asyncio.Task | None = None
        self._interrupted: ExecuteRequest | None = None  # the program an interrupt hit
        #: resolved once that program is over: a next one waits for it instead of a 409
        self._stopped: asyncio.Future[None] | None = None
        #: programs sent to the session that wait to start (in ``SessionCheckout``)
        self._waiting: set[ExecuteRequest] = set()

    # ------------------------------------------------------------------ record

    def idle_deadline(self) -> float | None:
        """When an idle session ends by its idle timeout; None while it starts or runs."""
        idle_from = self.last_finished_at or self.created_at
        return idle_from + self.idle_timeout if self.state == "IDLE" else None

    def record(self) -> dict[str, Any]:
        deadline = self.idle_deadline()
        return {
            "session_id": self.id,
            "owner": self.owner,
            "state": self.state,
            "gpu_count": self.gpu_count,
            "gpu_ids": list(self.gpu_ids),
            "worker_id": self.seat.id,
            "created_at": self.created_at,
            "last_program_finished_at": self.last_finished_at,
            "idle_timeout_seconds": self.idle_timeout,
            "idle_deadline": deadline,
            "programs": self.programs,
            "end_reason": self.end_reason,
            "end_message": self.end_message,
            "memory_bytes": self.memory_bytes(),
        }

    def memory_bytes(self) -> int | None:
        """Resident memory of the session's worker (its process tree: under bubblewrap the
        worker is a child of ``bwrap``); None once it ended or when ``/proc`` cannot say."""
        handle = self.seat.worker
        pid = handle.pid if handle is not None else None
        if self.state == "ENDED" or pid is None:
            return None
        sizes = [resident_bytes(p) for p in (pid, *procfs.descendants(pid))]
        known = [size for size in sizes if size is not None]
        return sum(known) if known else None

    def seat_status(self) -> dict[str, Any]:
        """This session's seat as ``/internal/worker-status`` lists it (EXTENSIONS §11)."""
        handle = self.seat.worker
        return {
            "seat_id": self.seat.id,
            "session_id": self.id,
            "owner": self.owner,
            "state": self.state,
            "gpu_ids": list(self.gpu_ids),
            "worker_pid": handle.pid if handle is not None else None,
            "memory_bytes": self.memory_bytes(),
        }

    # ------------------------------------------------------------------ programs

    @property
    def gpu_count(self) -> int | None:
        """How many GPUs are pinned to the session; None on a CPU server."""
        return len(self.gpu_ids) or None

    def check_options(self, options: Options) -> None:
        """A program's own ``gpu_count`` may only repeat the session's (its GPUs are pinned)."""
        wanted = self.gpu_count
        if options.gpu_count is not None and options.gpu_count != wanted:
            held = f"({wanted})" if wanted is not None else "(none: a CPU session)"
            message = f"gpu_count {options.gpu_count} differs from this session's {held}"
            raise RequestFailed(400, "parse", message, "rejected")

    def refusal(self) -> Refusal | None:
        """Why a program cannot run now: 410 for an ended session, 409 while one runs."""
        if self.state == "ENDED":
            message = self.end_message or "session ended"
            return Refusal(410, "session_ended", message, "rejected")
        if self.state != "IDLE":
            # an interrupted program (its client left, or POST interrupt) is stopping: the
            # next one waits for it in checkout, as it waits for the worker's clean-up
            return None if self._stopped is not None else BUSY
        if not self.check_alive():
            return self.refusal()
        return None

    def check_alive(self) -> bool:
        """End an idle session whose worker died between programs; False when it did."""
        handle = self.seat.worker
        if self.state == "IDLE" and (
            handle is None or handle.gone is not None or handle.returncode is not None
        ):
            self.end("worker_exited", exited_message(self.seat.worker, None))
        return self.state != "ENDED"

    def interrupt(self) -> bool:
        """Raise ``KeyboardInterrupt`` in the running program (SIGINT to its worker); one
        that waits for its GPUs stops waiting at once. A program still running
        ``INTERRUPT_GRACE_SECONDS`` after it was sent the interrupt is killed under its
        lease, which ends the session. A program that waits to start is cancelled: it
        never runs, and the session and its state stay (EXTENSIONS §11): it ran once its
        wait ended, while its cell said it was interrupted. False when no program runs or
        waits."""
        waiting, self._waiting = self._waiting, set()
        for request in waiting:
            request.cancel("cancelled", RequestFailed(409, "cancelled", NOT_STARTED, "cancelled"))
        running = self.running
        handle = self.seat.worker
        if running is None or handle is None or handle.pid is None:
            return bool(waiting)
        if self._interrupted is not running:
            self._interrupted = running
            self._stopped = asyncio.get_running_loop().create_future()
            self._signal_once_started(running, handle, graced=False)
        return True

    def _signal_once_started(
        self, request: ExecuteRequest, handle: WorkerHandle, *, graced: bool
    ) -> None:
        """SIGINT to ``handle`` once it runs ``request``'s program: the worker drops one that
        lands between programs (``worker.state``), so one sent before the program
        reached it would be lost. Started means sent and, where the worker shares a progress
        slot, its first instruction begun; until then this looks again every few ms.

        The grace counts from the program's arrival at the worker, whose wait for the
        GPUs' lease the interrupt ends at once (``LeaseHolder.interrupt``): counted from
        the interrupt, a program queued behind another identity's on its GPUs was killed
        with the session for a wait it could not cut short (team soak)."""
        if self.running is not request or handle.gone is not None or handle.pid is None:
            return  # it ended (or never will start): nothing to interrupt
        loop = asyncio.get_running_loop()
        if request.cancellation.driven is handle and not graced:
            graced = True
            handle.lease.interrupt()
            loop.call_later(INTERRUPT_GRACE_SECONDS, self._interrupt_expired, request)
        slot = handle.progress
        if graced and (slot is None or slot.any_started()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, signal.SIGINT)
            return
        loop.call_later(
            START_POLL_SECONDS,
            functools.partial(self._signal_once_started, request, handle, graced=graced),
        )

    def _interrupt_expired(self, request: ExecuteRequest) -> None:
        if self.running is request:
            # ended now, then killed (end): it ended only once its worker was released, so
            # a client that saw the job finish could still read the session as running
            self.end("interrupt_grace", not_stopped_message(program_name(request)))

    def answer_for(self, failed: RequestFailed) -> RequestFailed:
        """The answer of a program that failed with ``failed``: one whose worker was gone
        before its first instruction began (500 ``worker crashed``) never ran; its worker
        died between programs and only this program noticed, so it gets the 410 that the
        next program after a noticed death gets (EXTENSIONS §11)."""
        if (
            failed.reason == "crashed"
            and failed.status == 500
            and self.end_reason == "worker_exited"
        ):
            return RequestFailed(
                410, "session_ended", self.end_message or "session ended", "crashed"
            )
        return failed

    def program_over(self) -> None:
        """Wake the programs that wait for an interrupted one to stop."""
        stopped, self._stopped = self._stopped, None
        if stopped is not None and not stopped.done():
            stopped.set_result(None)

    def checkout(self, request: ExecuteRequest) -> SessionCheckout:
        """The pipeline's seat for ``request`` (instead of ``Pool.checkout``)."""
        return SessionCheckout(self, request)

    def _released(self, retire_reason: str | None) -> None:
        """``Pool.release`` for this seat: keep the worker, or end the session."""
        program = program_name(self.running) if self.running is not None else None
        interrupted = self._interrupted is not None and self._interrupted is self.running
        self._interrupted = None
        self.running = None
        self.program_over()
        self.last_finished_at = time.time()
        if self.state == "ENDED":
            # ended (deleted, or the server shut down) after its program had finished: the
            # cancel came too late to stop the worker, so it retires here; it would have been
            # idle again, holding its seat and taking programs, in a session said to be over
            self.registry.retire(self)
            return
        handle = self.seat.worker
        if retire_reason is None and handle is not None:
            # idle for its owner at once; the next program waits for the clean-up (checkout)
            self.state = "IDLE"
            self._settling = asyncio.ensure_future(self._settle(handle, program))
            return
        self.end(*retired_end(retire_reason, program, interrupted, handle))

    async def _settle(self, handle: WorkerHandle, program: str | None) -> None:
        """Wait for the worker's clean-up after a program (it says ready again)."""
        reason = await reason_to_retire(handle)
        if reason == ipc.SANDBOX_CLEANUP:
            self.end(
                END_REASONS[reason],
                f"session ended: {program} left files in its workspace that could not be removed",
            )
            return
        if reason is not None:
            self.end("worker_exited", exited_message(self.seat.worker, program))
            return
        if self.state == "IDLE":
            self.seat.state = SeatState.IDLE
            self._arm_idle_timer()

    def _arm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(self.idle_timeout, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self.state == "IDLE":
            message = idle_message(self.idle_timeout, self.idle_asked, self.registry.idle_seconds)
            self.end("idle_timeout", message)

    # ------------------------------------------------------------------ end

    def end(self, reason: str, message: str) -> None:
        """End the session once: its worker retires in the background, its seat is freed."""
        if self.state == "ENDED":
            return
        running = self.running
        self.state = "ENDED"
        self.end_reason = reason
        self.end_message = message
        self.ended_at = time.time()
        self.seat.state = SeatState.CLOSED
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.registry.events.emit(
            "session_ended",
            "INFO" if reason in ("deleted", "idle_timeout", "shutdown") else "WARNING",
            session_id=self.id,
            owner=self.owner,
            reason=reason,
            message=message,
            programs=self.programs,
        )
        if running is not None:
            # a program still runs: it is killed (under its lease) and its client, if one
            # waits, is told the session ended; the pool's release then finds it ended
            running.cancel("cancelled", ended_under(message))
            return
        self.registry.retire(self)


def least_used_gpus(
    gpu_ids: list[int], pinned: list[list[int]], count: int, busy: Mapping[int, int] | None = None
) -> list[int]:
    """The GPU set of a new session (EXTENSIONS §11): the ``count`` GPUs of ``gpu_ids`` (the
    server's, in ``--gpus`` order) pinned to the fewest live sessions (``pinned``: their
    sets), among equals the least ``busy`` now (its lease held or waited for: the session's
    worker initialises CUDA under it, team soak), then lowest id; returned in ``--gpus``
    order, the order in which the lease arbiter hands out a stateless program's set."""
    load = dict.fromkeys(gpu_ids, 0)
    for gpu_set in pinned:
        for gpu_id in gpu_set:
            if gpu_id in load:
                load[gpu_id] += 1
    now = busy or {}
    chosen = set(sorted(load, key=lambda gpu: (load[gpu], now.get(gpu, 0), gpu))[:count])
    return [gpu_id for gpu_id in gpu_ids if gpu_id in chosen]


def resident_bytes(pid: int) -> int | None:
    """``pid``'s resident set size from ``/proc/<pid>/statm``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * PAGE_SIZE


class SessionCheckout:
    """``Session.checkout``'s context: the pinned seat, refused when the session cannot run."""

    __slots__ = ("_request", "_session")

    def __init__(self, session: Session, request: ExecuteRequest) -> None:
        self._session = session
        self._request = request

    async def __aenter__(self) -> Seat:
        session = self._session
        request = self._request
        # While it waits, a cancel (an interrupt, its job's DELETE, its client gone) ends
        # it there: it never reaches the worker, which keeps the session's state. Found in a
        # real kernel: its wait ignored the cancel and it ran once the wait ended (a cancel
        # that a program on the worker finds kills the worker, ending the session).
        session._waiting.add(request)
        try:
            if session._stopped is not None:  # at most the interrupt's grace
                await request.cancellation.unless(asyncio.shield(session._stopped))
            refusal = session.refusal()
            settling = session._settling
            if refusal is None and settling is not None and not settling.done():
                # the worker's clean-up after the last program
                await request.cancellation.unless(asyncio.shield(settling))
                refusal = session.refusal()
        finally:
            session._waiting.discard(request)
        if request.cancel_reason is not None:  # in the tick its wait ended
            raise request.cancellation.failure()
        if refusal is not None:
            raise refusal.failure()
        if session._idle_timer is not None:
            session._idle_timer.cancel()
            session._idle_timer = None
        session.state = "RUNNING"
        session.seat.state = SeatState.BUSY
        session.running = self._request
        session.programs += 1
        return session.seat

    async def __aexit__(self, *exc_info: object) -> None:
        session = self._session
        if session.running is self._request:  # it never reached the worker
            session.running = None
            session.program_over()
            if session.state == "RUNNING":
                session.state = "IDLE"
                session.seat.state = SeatState.IDLE
                session._arm_idle_timer()
        if session.state == "ENDED" and session.seat.worker is not None:
            session.registry.retire(session)


class Sessions:
    """Every session of one server (``--max-sessions`` seats beyond the stateless ones)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.events = state.events
        self.max = int(state.config.max_sessions)
        self.rules = SeatRules(self.max, None)  # fair seats: no identity takes them all
        self.use_identity_count(state.authenticator.identity_count)
        self.idle_seconds = float(state.config.session_idle_seconds)
        self.retention = float(state.config.job_retention_seconds)
        self.sessions: dict[str, Session] = {}
        self._retiring: set[asyncio.Task] = set()

    def use_identity_count(self, identities: int | None) -> None:
        """The per-identity cap for ``identities`` callers (at start, and when a token
        reload changes how many there are)."""
        setting = self.state.config.max_sessions_per_identity
        self.rules = SeatRules(self.max, per_identity_cap(self.max, setting, identities))

    @property
    def active(self) -> int:
        return sum(1 for s in self.sessions.values() if s.state != "ENDED")

    def live(self) -> list[Session]:
        return [s for s in self.sessions.values() if s.state != "ENDED"]

    @property
    def programs_running(self) -> int:
        """Session programs on their workers now: they run on no pool seat, so a draining
        server counts them beside the pool's requests (SERVER §12)."""
        return sum(1 for s in self.sessions.values() if s.running is not None)

    def info(self, identity: Identity) -> dict[str, Any]:
        """``/v1/info``'s ``sessions`` object, with the caller's share: a router places a
        session only where the caller is below ``max_per_identity`` (ROUTER §13)."""
        return {
            "max": self.max,
            "active": self.active,
            "idle_timeout_seconds": self.idle_seconds,
            "max_per_identity": self.rules.cap,
            "held_by_you": sum(1 for s in self.live() if s.owner == identity.name),
        }

    def _forget_old(self) -> None:
        now = time.time()
        for key, session in list(self.sessions.items()):
            if session.ended_at is not None and now - session.ended_at > self.retention:
                del self.sessions[key]

    def get(self, identity: Identity, session_id: str) -> Session | None:
        """The caller's session (any for an admin), else None: another identity's session
        answers exactly as an unknown one."""
        self._forget_old()
        session = self.sessions.get(session_id)
        if session is None or not (identity.admin or session.owner == identity.name):
            return None
        session.check_alive()  # its record says so as soon as its worker is gone
        return session

    def seats(self) -> list[dict[str, Any]]:
        """The seats live sessions hold (``/internal/worker-status``), oldest first."""
        live = [s for s in self.sessions.values() if s.state != "ENDED"]
        return [s.seat_status() for s in sorted(live, key=lambda s: s.created_at)]

    def listed(self, identity: Identity) -> list[dict[str, Any]]:
        self._forget_old()
        mine = [s for s in self.sessions.values() if identity.admin or s.owner == identity.name]
        return [s.record() for s in sorted(mine, key=lambda s: s.created_at, reverse=True)]

    async def create(
        self, identity: Identity, gpu_count: int | None, idle_timeout: float | None
    ) -> Session:
        """Start a session's worker; ``NoWorker`` when no session seat is free or it fails."""
        pool = self.state.pool
        refusing = self.state.refusing()  # why, as a program's 503 says it (PROTOCOL §7.1)
        if refusing is not None:
            raise NoWorker(refusing)
        refusal = self.rules.refusal(self.live(), identity.name)
        if refusal is not None:
            raise NoWorker(refusal)
        gpu_ids = self._pick_gpus(gpu_count) if gpu_count else []
        session = Session(self, identity.name, gpu_ids, idle_timeout or self.idle_seconds)
        session.idle_asked = idle_timeout is not None
        self.sessions[session.id] = session
        # the seat (and its GPUs) count from here: a concurrent create sees them taken
        handle = pool.handles.for_session(session.seat, gpu_ids)
        handle.lease.identity = identity.name  # its start-up takes its owner's turn (SERVER §5)
        try:
            await handle.start()
            handle.identity = identity.name
            session.seat.worker = handle
        except Exception as exc:
            await pool.kill(handle)
            session.seat.worker = None
            session.end("worker_exited", f"session worker failed to start: {exc}")
            raise NoWorker(f"the session's worker failed to start: {exc}") from None
        session.state = "IDLE"
        session.seat.state = SeatState.IDLE
        session._arm_idle_timer()
        self.events.emit(
            "session_started",
            session_id=session.id,
            owner=session.owner,
            worker_id=session.seat.id,
            gpu_ids=gpu_ids,
            pid=handle.pid,
            idle_timeout_seconds=session.idle_timeout,
        )
        return session

    def _pick_gpus(self, count: int) -> list[int]:
        live = [s.gpu_ids for s in self.sessions.values() if s.state != "ENDED"]
        busy: dict[int, int] = {}
        if (arbiter := self.state.arbiter) is not None:
            for gpu in self.state.gpu_ids:
                busy[gpu] = (arbiter.holder(gpu) is not None) + arbiter.waiting(gpu)
        return least_used_gpus(self.state.gpu_ids, live, count, busy)

    def retire(self, session: Session) -> None:
        """Stop an ended session's worker in the background (under its lease)."""
        handle, session.seat.worker = session.seat.worker, None
        sandbox, session.seat.sandbox = session.seat.sandbox, None
        if handle is None and sandbox is None:
            return
        task = asyncio.ensure_future(self._retire(handle, sandbox))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, handle: WorkerHandle | None, sandbox: SeatSandbox | None) -> None:
        grace = float(self.state.config.worker_termination_grace_seconds)
        if handle is not None and not await self.state.pool.stop_worker(handle, grace):
            await self.state.pool.kill(handle)
        if sandbox is not None:  # under bubblewrap: the session's own sandbox directory
            await asyncio.get_running_loop().run_in_executor(None, sandbox.close)

    async def close(self) -> None:
        """Shutdown: every session ends (``shutdown``) and its worker stops."""
        for session in list(self.sessions.values()):
            session.end("shutdown", "session ended: the server shut down")
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
