"""A program that asks for ``gpu_count`` GPUs: a transient worker on a leased GPU set
(PROTOCOL §6.5, SERVER §8).

The set is leased before the worker starts (any ``count`` free GPUs, FIFO with the other
waiters), the worker is started on it under the request's deadline, runs the program like a
seat's worker (``SeatRun.drive_program``) and is killed while it still holds the set, so
that no CUDA context outlives the lease. Its seat is given back unused either way.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kcoral_server.execution.admitted import AdmittedProgram
from kcoral_server.execution.blob_handover import read_output
from kcoral_server.execution.outcome import confirm_cleanup
from kcoral_server.execution.request_record import RunTimes
from kcoral_server.execution.responses import (
    GPUS_QUARANTINED,
    ProgramOutcome,
    RequestFailed,
    saturated,
)
from kcoral_server.gpu.lease import GpuQuarantined
from kcoral_server.pool.seat import Seat
from kcoral_server.processes.start import WorkerStartError

if TYPE_CHECKING:
    from kcoral_server.execution.run import SeatRun

__all__ = ["execute_on_gpu_set"]


async def execute_on_gpu_set(
    run: SeatRun, seat: Seat, admitted: AdmittedProgram, queue_ms: float
) -> ProgramOutcome:
    """PROTOCOL §6.5: ``run``'s program on a transient fresh worker holding a set of the
    ``gpu_count`` GPUs it asks for."""
    state = run.state
    assert state.arbiter is not None
    count = admitted.program.options.gpu_count
    assert count is not None
    timeout = admitted.timeout
    started = time.monotonic()
    handle = state.pool.handles.for_gpu_set(seat)
    handle.lease.begin_request(run.request_id, run.identity.name)
    handle.lease.observe(run.observer.lease)
    try:
        gpu_ids = await run.cancellation.unless(
            handle.take_gpu_set(count, run.request_id, state.gpu_uuid)
        )
    except BaseException as exc:
        handle.lease.withdraw()
        # A wait for a set that never came (its client left, a cancel, a shutdown) is still
        # a wait for GPUs: logged with no set and counted under gpu "none" (SERVER §13)
        waited, _held = handle.lease.end_request()
        run.record.gpu_ids = []
        run.record.times = RunTimes(
            elapsed_ms=(time.monotonic() - started) * 1000.0,
            lease_wait_ms=waited * 1000.0,
            lease_held_ms=0.0,
        )
        state.pool.release_unused(seat)
        if isinstance(exc, GpuQuarantined):
            raise saturated(GPUS_QUARANTINED).failure() from None
        raise
    run.record.gpu_ids = gpu_ids
    run.observer.gpu_set(list(gpu_ids))
    state.events.emit(
        "request_routed",
        request_id=run.request_id,
        worker_id=seat.id,
        gpu_id=seat.gpu_id,
        gpu_ids=gpu_ids,
        generation=seat.generation,
        pid=None,
        queue_ms=queue_ms,
    )
    try:
        remaining = timeout - run.budget_used(handle, started)
        try:
            await run.cancellation.unless(handle.start(timeout=max(0.001, remaining)))
        except WorkerStartError as exc:
            await state.pool.kill(handle)
            confirm_cleanup(handle)
            if run.budget_used(handle, started) >= timeout:
                raise RequestFailed(504, "timeout", run.timeout_message, "timeout") from None
            raise RequestFailed(
                500, "engine", "worker crashed", "crashed", error_detail=str(exc)
            ) from None
        drive = await run.drive_program(handle, admitted, started)
        # The transient worker is killed while holding its set (§6.5).
        await state.pool.kill(handle)
        output = await read_output(drive, run.observer, state.executor)
        outcome = await run.finish_outcome(drive, handle, started, output)
        outcome.gpu_ids = gpu_ids
        return outcome
    finally:
        await state.pool.kill(handle)
        handle.lease.release()
        state.pool.release_unused(seat)
