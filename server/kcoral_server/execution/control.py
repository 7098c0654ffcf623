"""What follows a request from outside and what stops it: the hooks a job uses to watch
its request (``RequestObserver``), the request's cancel (``Cancellation``, EXTENSIONS §5,
§9) that stops its wait for a seat or interrupts its worker, the wait for what a queue
hands over (``handed_over``: a server's seat, a router's slot) that a cancel must end, and
the order such a queue serves its identities' waiters in (``served_in_turn``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from kcoral_server.execution.responses import RequestFailed

if TYPE_CHECKING:
    from kcoral_server.execution.pipeline import ExecuteRequest
    from kcoral_server.processes.handle import WorkerHandle
    from kcoral_server.processes.progress_slot import ProgressSlot
    from kcoral_server.storage.workspace import Workspace

T = TypeVar("T")

CANCELLED_STATUS = 499  # logged only: nobody is left to receive a cancelled request's answer
CANCEL_MESSAGES = {
    "cancelled": "the job was cancelled",
    "client_disconnected": "the client disconnected",
}


class RequestObserver:
    """Hooks a job uses to follow its request (``/execute`` passes none: all no-ops).

    Called on the event loop, in this order: ``accepted`` (every check passed, about to
    queue), ``assigned``, then any ``gpu_set``/``lease``/``instruction`` calls, ``output_started`` /
    ``output_finished`` around the program's run. ``output_finished`` must drain the capture
    files before the response reads them.
    """

    def accepted(self, request: ExecuteRequest) -> None:
        pass

    def assigned(self, seat_id: str, gpu_ids: list[int], queue_ms: float) -> None:
        """The request checked out ``seat_id`` (``worker_id`` on the wire and in logs: a
        seat outlives the worker processes it runs)."""
        pass

    def gpu_set(self, gpu_ids: list[int]) -> None:
        """A ``gpu_count`` program (PROTOCOL §6.5) now holds the set ``gpu_ids``: the GPUs
        it runs on, not its borrowed seat's (``assigned`` gave it none)."""
        pass

    def lease(self, phase: str) -> None:
        pass

    def instruction(
        self,
        index: int,
        op: str,
        instruction_id: str | None,
        output_sizes: tuple[int, int] | None = None,
    ) -> None:
        """Instruction ``index`` started; the program had then written ``output_sizes``
        bytes of stdout and stderr (``None``: not known)."""
        pass

    @property
    def follows_instructions(self) -> bool:
        """Whether ``instruction`` does anything: only then does the worker report each
        instruction by frame as it starts (else the progress slot alone records it)."""
        return type(self).instruction is not RequestObserver.instruction

    def output_started(self, workspace: Workspace, limit: int) -> None:
        pass

    def output_order(self, runs: Sequence[tuple[int, int]]) -> None:
        """How the program's stdout and stderr interleaved so far, in bytes of the capture
        files (EXTENSIONS §16): output that has not left yet leaves in this order."""
        pass

    def output_record(self, slot: ProgressSlot) -> None:
        """The worker's progress slot, where it writes each run as it happens (EXTENSIONS
        §16): a live follower reads the order there at each poll, for this program only."""
        pass

    async def output_finished(self) -> None:
        pass


NO_OBSERVER = RequestObserver()


class Cancellation:
    """A request's cancel (EXTENSIONS §5, §9) as its run sees it: the reason, an event
    that stops waits, and the worker whose receive it interrupts."""

    def __init__(self) -> None:
        self.reason: str | None = None
        #: what a client still waiting is answered, where the canceller says (else 499)
        self._answer: RequestFailed | None = None
        self._event = asyncio.Event()
        self._driving: WorkerHandle | None = None  # the worker running the program now

    def cancel(self, reason: str, answer: RequestFailed | None = None) -> bool:
        """False when cancelled before. ``answer``: what the request answers instead of
        the 499 that only the log sees (a session that ended under its program tells the
        client still waiting for it so, EXTENSIONS §11)."""
        if self.reason is not None:
            return False
        self.reason = reason
        self._answer = answer
        self._event.set()
        if self._driving is not None:
            self._driving.channel.interrupt()
        return True

    def driving(self, handle: WorkerHandle | None) -> None:
        """``handle`` runs the program now (None: no longer)."""
        self._driving = handle

    @property
    def driven(self) -> WorkerHandle | None:
        """The worker the program was sent to, until its end (None before and after)."""
        return self._driving

    def failure(self) -> RequestFailed:
        if self._answer is not None:
            return self._answer
        reason = self.reason or "cancelled"
        return RequestFailed(
            CANCELLED_STATUS, "cancelled", CANCEL_MESSAGES.get(reason, reason), reason
        )

    async def unless(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless the request is cancelled first (then it is cancelled
        too, and ``RequestFailed`` is raised). Cancelling the task that waits here cancels
        ``awaitable`` as well and waits for its end, as a plain ``await`` would: otherwise
        it ran on for nobody (a GPU set taken, a worker started, after shutdown)."""
        if self.reason is not None:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise self.failure()
        task = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: its end, whatever it was, is nobody's now
            raise
        finally:
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise self.failure()


def served_in_turn(queues: Sequence[Sequence[T]]) -> list[T]:
    """The waiters of ``queues`` (one per identity, oldest first, in the order of their
    turns) in the order they are served: the first of each queue, then the second of each,
    and so on (SERVER §4, ROUTER §7.3)."""
    return [
        q[turn] for turn in range(max(map(len, queues), default=0)) for q in queues if turn < len(q)
    ]


async def handed_over(
    future: asyncio.Future[T],
    timeout: float,
    timed_out: Callable[[], BaseException],
    give_back: Callable[[T], None],
) -> T:
    """What a queue hands ``future`` (a seat, a router slot), or ``timed_out()`` raised
    after ``timeout`` seconds. A cancelled wait always raises, and what was handed over
    before its task ran again goes back through ``give_back``.

    A timer, not ``asyncio.wait_for``: up to Python 3.11 wait_for returns the result of a
    future done in the tick its task is cancelled, swallowing the cancel, so a request whose
    client had gone kept what it was handed (a server's seat stayed busy for good, a
    router's slot was forwarded for nobody)."""
    timer = asyncio.get_running_loop().call_later(timeout, _fail_unless_done, future, timed_out)
    try:
        return await future
    except BaseException:
        if future.done() and not future.cancelled() and future.exception() is None:
            give_back(future.result())
        future.cancel()
        raise
    finally:
        timer.cancel()


def _fail_unless_done(future: asyncio.Future[T], timed_out: Callable[[], BaseException]) -> None:
    if not future.done():
        future.set_exception(timed_out())
