"""Ending a worker: killed while holding its GPUs' lease, or stopped politely, and its GPUs
quarantined when its end cannot be confirmed (SERVER.md §5, §8, §11). ``WorkerEnds`` does
it for one pool (``Pool.kill``, ``Pool.stop_worker``) and remembers the first end it could
not confirm, after which the pool admits nothing.

Who can reach what: a worker killed without the lease could still be running on a GPU that
the next program already leased, and see that program's memory; a GPU whose worker may
still run is never leased again.
"""

from __future__ import annotations

from collections.abc import Callable

from kcoral_server.gpu.lease import GpuQuarantined, LeaseArbiter
from kcoral_server.processes.handle import WorkerHandle, event_fields
from kcoral_server.storage.event_log import EventLog

#: told ``lease_wait`` / ``lease_held`` where a kill or start-up waits for a GPU's lease (a
#: program's job: those waits are its program's); None: nobody listens
LeasePhases = Callable[[str], None] | None


class WorkerEnds:
    """How one pool's workers end; ``on_unconfirmed`` (called once, with the reason) stops
    the pool admitting when an end could not be confirmed."""

    def __init__(
        self,
        arbiter: LeaseArbiter | None,
        events: EventLog,
        grace: float,
        on_unconfirmed: Callable[[str], None],
    ) -> None:
        self.arbiter = arbiter
        self.events = events
        self.grace = grace  # --worker-termination-grace-seconds
        self.on_unconfirmed = on_unconfirmed
        #: the first end that could not be confirmed (its GPUs are quarantined)
        self.quarantine_reason: str | None = None

    async def kill(self, handle: WorkerHandle, lease_phases: LeasePhases = None) -> None:
        """Kill a worker's process tree while holding its GPU's lease (§5); quarantine its
        GPUs when the kill cannot be confirmed. A second call does nothing.
        ``lease_phases`` hears a wait for that lease (``kill_under_lease``)."""
        if handle.killed:
            return
        # A worker whose exit report was believed has nothing left to run (SERVER §8): no
        # grace, so a program that forged the report never outlives it by ``grace`` seconds
        # beside its seat's next program.
        grace = 0.0 if handle.exit_announced else self.grace
        await kill_under_lease(handle, self.arbiter, grace, lease_phases)
        self._check_cleanup(handle)

    async def stop(self, handle: WorkerHandle, timeout: float) -> bool:
        """Retire a worker politely: ``Shutdown``, then wait for its exit. The lease it holds
        is kept until the process is gone. False when it did not exit within ``timeout``."""
        exited = await stop_politely(handle, timeout, self.grace)
        if exited:
            self._check_cleanup(handle)
        return exited

    def _check_cleanup(self, handle: WorkerHandle) -> None:
        """SERVER §8, §11: a worker whose end could not be confirmed may still be running
        on its GPUs. They are quarantined (never leased again) and the server stops
        admitting requests; requests already running finish (those that need a quarantined
        GPU answer 503)."""
        first = self.quarantine_reason is None
        if quarantine_unconfirmed(handle, self.arbiter, self.events) and first:
            assert handle.cleanup_unconfirmed is not None
            self.quarantine_reason = handle.cleanup_unconfirmed
            self.on_unconfirmed(self.quarantine_reason)


async def kill_under_lease(
    handle: WorkerHandle,
    arbiter: LeaseArbiter | None,
    grace: float,
    lease_phases: LeasePhases = None,
) -> None:
    """Kill ``handle``'s process tree holding its GPUs' lease (taken first when the worker
    does not hold it), then free the lease. ``lease_phases`` hears ``lease_wait`` and
    ``lease_held`` where another holds the lease: a program whose seat's old worker is
    killed for it waits for the GPU there (its job read ``RUNNING`` alone)."""
    token: object | None = None
    if arbiter is not None and handle.gpu_ids and not handle.lease.held:
        handle.lease.withdraw()
        token = object()
        waits = lease_phases
        if waits is not None and all(arbiter.holder(gpu) is None for gpu in handle.gpu_ids):
            waits = None  # free: taken at once, no wait to tell
        if waits is not None:
            waits("lease_wait")
        try:
            await arbiter.acquire(token, handle.gpu_ids, request_id=handle.request_id)
        except GpuQuarantined:
            token = None  # never leased again: kill without it
        if waits is not None:
            waits("lease_held")
    try:
        await handle.kill(grace)
    finally:
        if token is not None:
            arbiter.release(token, handle.gpu_ids)  # type: ignore[union-attr]
    handle.lease.release()


async def stop_politely(handle: WorkerHandle, timeout: float, grace: float) -> bool:
    """``Shutdown``, then wait for the exit; the lease it holds is kept until the process
    is gone. False when it did not exit within ``timeout``."""
    exited = await handle.stop(timeout, grace)
    if exited:
        handle.close()
        handle.lease.release()
    return exited


def quarantine_unconfirmed(
    handle: WorkerHandle, arbiter: LeaseArbiter | None, events: EventLog
) -> bool:
    """When ``handle``'s end could not be confirmed: quarantine its GPUs (never leased
    again), say so (``devices_quarantined``) and return True; else False."""
    if handle.cleanup_unconfirmed is None:
        return False
    if arbiter is not None and handle.gpu_ids:
        arbiter.quarantine(handle.gpu_ids)
    events.emit(
        "devices_quarantined",
        "ERROR",
        **event_fields(handle),
        gpu_ids=list(handle.gpu_ids),
        quarantined=sorted(arbiter.quarantined) if arbiter is not None else [],
        error=handle.cleanup_unconfirmed,
    )
    return True
