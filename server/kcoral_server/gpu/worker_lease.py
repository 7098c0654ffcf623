"""A worker's GPU lease, held in the front-end on the worker's behalf (SERVER §5).

The worker asks (``LeaseAcquire``) and gives back (``LeaseRelease``) over its channel; the
``LeaseHolder`` asks the arbiter, answers the worker through ``grant`` and measures what
the current request waited and held. It is the arbiter's owner key for the worker: the
worker is killed while the lease is held (or re-taken by the pool), never while another
worker's CUDA context could be running on the same GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kcoral_server.gpu.lease import GpuQuarantined, LeaseArbiter


@dataclass
class LeaseClock:
    """Lease timings of the current request, measured by the front-end (seconds)."""

    wait_total: float = 0.0
    held_total: float = 0.0
    waiting_since: float | None = None
    held_since: float | None = None

    def wait_so_far(self, now: float) -> float:
        return self.wait_total + (now - self.waiting_since if self.waiting_since else 0.0)


class LeaseHolder:
    """The lease of one worker: which GPUs, whether held, and the current request's clock.

    ``grant`` tells the worker it holds the lease; ``refused`` is called once when a GPU it
    needs was quarantined (the worker stays blocked; its request answers 503)."""

    def __init__(
        self,
        arbiter: LeaseArbiter | None,
        gpu_ids: Sequence[int],
        *,
        grant: Callable[[], None],
        refused: Callable[[str], None],
        withdrawn: Callable[[], None] = lambda: None,
    ) -> None:
        self.arbiter = arbiter
        self.gpu_ids = list(gpu_ids)
        self.held = False
        self.clock = LeaseClock()
        #: a GPU this worker needs was quarantined: its request answers 503
        self.quarantined = False
        self.request_id: str | None = None
        #: whose turn this worker's waits take at the arbiter (the current request's caller)
        self.identity: str | None = None
        self._grant = grant
        self._refused = refused
        self._withdrawn = withdrawn
        #: the current request was interrupted: its waits end unanswered (EXTENSIONS §11)
        self.interrupted = False
        self._acquiring: asyncio.Task | None = None
        self._observer: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ the worker asks

    def worker_asks(self, worker_gone: Callable[[], bool]) -> None:
        """``LeaseAcquire`` arrived: grant at once when there is nothing to wait for, else
        queue at the arbiter (``worker_gone`` says whether to answer once granted)."""
        if self.arbiter is None or not self.gpu_ids or self.held:
            self._grant()  # a CPU worker should never ask; never leave it blocked
            return
        if self.interrupted:
            self._withdrawn()  # it would only run to be interrupted: it stops here
            return
        if self._acquiring is not None and not self._acquiring.done():
            return
        self.clock.waiting_since = time.monotonic()
        self._phase("lease_wait")
        self._acquiring = asyncio.ensure_future(self._acquire(worker_gone))

    async def _acquire(self, worker_gone: Callable[[], bool]) -> None:
        assert self.arbiter is not None
        try:
            await self.arbiter.acquire(
                self, self.gpu_ids, request_id=self.request_id, identity=self.identity
            )
        except GpuQuarantined as exc:
            # The worker stays blocked (never granted); its request sees it gone and
            # answers 503, and whoever cleans up kills it without the lease.
            self.quarantined = True
            self._refused(str(exc))
            return
        self._now_held(time.monotonic())
        if worker_gone():
            return  # the dead worker keeps it until whoever cleans up releases it
        self._phase("lease_held")
        self._grant()

    def _now_held(self, now: float) -> None:
        self._now_waiting_over(now)
        self.held = True
        self.clock.held_since = now

    async def take_set(self, count: int, request_id: str) -> list[int]:
        """PROTOCOL §6.5: wait for any ``count`` GPUs for a worker not started yet; they
        become this holder's GPUs, held. Cancelling the wait leaves nothing held or queued;
        ``GpuQuarantined`` when ``count`` can no longer be met."""
        assert self.arbiter is not None
        started = time.monotonic()
        self.clock.waiting_since = started
        self._phase("lease_wait")
        try:
            gpu_ids = list(
                await self.arbiter.acquire(
                    self, count=count, request_id=request_id, identity=self.identity
                )
            )
        except BaseException:
            self.withdraw()
            raise
        self._phase("lease_held")
        self.gpu_ids = gpu_ids
        self._now_held(time.monotonic())
        return gpu_ids

    def release(self) -> None:
        """Give the lease back (``LeaseRelease``, or the worker is gone or idle)."""
        if self.clock.held_since is not None:
            self.clock.held_total += time.monotonic() - self.clock.held_since
            self.clock.held_since = None
        if self.arbiter is not None and self.held:
            self.arbiter.release(self, self.gpu_ids)
        self.held = False

    def interrupt(self) -> None:
        """The current request is interrupted: a wait of its worker ends now, unanswered by
        a grant (``withdrawn``), and so does every wait it starts until the request ends.
        Its place in the arbiter's queue goes to the next waiter; the lease it holds, it
        keeps: its program runs and takes the interrupt there."""
        if self.interrupted:
            return  # one withdrawal per wait: a second answer would meet the next ask
        self.interrupted = True
        if self._acquiring is None or self._acquiring.done() or self.held:
            return
        self.withdraw()  # a grant of this very tick goes back to the arbiter (``acquire``)
        self._now_waiting_over(time.monotonic())
        self._withdrawn()

    def _now_waiting_over(self, now: float) -> None:
        if self.clock.waiting_since is not None:
            self.clock.wait_total += now - self.clock.waiting_since
            self.clock.waiting_since = None

    def withdraw(self) -> None:
        """Leave the arbiter's queue (a worker being killed asks for nothing any more)."""
        if self._acquiring is not None and not self._acquiring.done():
            self._acquiring.cancel()
        if self.arbiter is not None:
            self.arbiter.withdraw(self)

    # ------------------------------------------------------------------ the request's clock

    @property
    def waiting(self) -> bool:
        return self.clock.waiting_since is not None

    def wait_so_far(self, now: float) -> float:
        return self.clock.wait_so_far(now)

    def observe(self, observer: Callable[[str], None] | None) -> None:
        """Tell ``observer`` "lease_wait" / "lease_held" (jobs report lease phases)."""
        self._observer = observer

    def _phase(self, phase: str) -> None:
        if self._observer is not None:
            with contextlib.suppress(Exception):  # an observer never breaks leasing
                self._observer(phase)

    def begin_request(self, request_id: str, identity: str | None = None) -> None:
        self.request_id = request_id
        self.identity = identity
        self.interrupted = False
        now = time.monotonic()
        self.clock = LeaseClock(
            waiting_since=now if self.clock.waiting_since else None,
            held_since=now if self.held else None,
        )

    def end_request(self) -> tuple[float, float]:
        """Stop the request's clock; its (wait, held) seconds."""
        now = time.monotonic()
        if self.clock.waiting_since is not None:
            self.clock.wait_total += now - self.clock.waiting_since
            self.clock.waiting_since = None
        if self.clock.held_since is not None:
            self.clock.held_total += now - self.clock.held_since
            self.clock.held_since = None if not self.held else now
        return self.clock.wait_total, self.clock.held_total

    def forget_start_up(self) -> None:
        """Start-up leasing of a seat is not part of any request."""
        if self.request_id is None:
            self.clock = LeaseClock()
