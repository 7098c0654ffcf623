"""Ending a worker: killed while holding its GPUs' lease, or stopped politely, and its GPUs
quarantined when its end cannot be confirmed (SERVER.md §5, §8, §11).

Who can reach what: a worker killed without the lease could still be running on a GPU that
the next program already leased, and see that program's memory; a GPU whose worker may
still run is never leased again.
"""

from __future__ import annotations

from typing import Any

from kcoral_server.gpu.lease import GpuQuarantined, LeaseArbiter
from kcoral_server.processes.handle import WorkerHandle, event_fields


async def kill_under_lease(
    handle: WorkerHandle, arbiter: LeaseArbiter | None, grace: float
) -> None:
    """Kill ``handle``'s process tree holding its GPUs' lease (taken first when the worker
    does not hold it), then free the lease."""
    token: object | None = None
    if arbiter is not None and handle.gpu_ids and not handle.lease.held:
        handle.lease.withdraw()
        token = object()
        try:
            await arbiter.acquire(token, handle.gpu_ids, request_id=handle.request_id)
        except GpuQuarantined:
            token = None  # never leased again: kill without it
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


def quarantine_unconfirmed(handle: WorkerHandle, arbiter: LeaseArbiter | None, events: Any) -> bool:
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
