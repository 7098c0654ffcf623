"""A seat's worker made fit for the identity whose program it is to run: a worker that
served another identity (another token holder) never serves this one, its ``/tmp``,
``HOME`` and caches being the other's (SERVER §14); it is killed under its GPU's lease and
a fresh one starts in a fresh sandbox directory, in this identity's turn (SERVER §5).

Who can reach what: only the pool, for a request it admitted; the program's job hears the
waits for the GPU's lease this takes (``lease_phases``), which are its program's waits.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kcoral_server.pool import retirement as pool_retirement
from kcoral_server.pool.kill import LeasePhases
from kcoral_server.pool.queue import NoWorker
from kcoral_server.pool.seat import Seat

if TYPE_CHECKING:
    from kcoral_server.pool.pool import Pool


async def serve_identity(
    pool: Pool, seat: Seat, identity: str, lease_phases: LeasePhases = None
) -> None:
    """Make the (acquired) seat's worker fit to run ``identity``'s program: a worker that
    served another identity is replaced by a fresh one (fresh sandbox directory: empty
    ``/tmp``, ``HOME`` and caches) first. ``NoWorker`` when the new one fails to start
    (the seat is then replaced in the background). ``lease_phases`` hears the waits for
    the GPU's lease this takes (the old worker's kill, the new one's start-up): the job
    read ``RUNNING`` alone through them."""
    handle = seat.worker
    if handle is None or handle.identity in (None, identity):
        if handle is not None:
            handle.identity = identity
        return
    pool_retirement.emit_retired(pool.events, seat, handle, "identity")
    started = False
    try:
        await pool.kill(handle, lease_phases)
        seat.worker = None
        await pool.spares.drop_held(seat)  # forked ahead in the directory closed next
        if seat.sandbox is not None:  # its HOME and caches are the other identity's
            old, seat.sandbox = seat.sandbox, None
            await asyncio.get_running_loop().run_in_executor(None, old.close)
        if pool.quarantine_reason is None:
            started = await pool.start_seat(
                seat, phase="respawn", idle=False, identity=identity, lease_phases=lease_phases
            )
    finally:
        if not started:
            seat.worker = None
            pool.schedule_replacement(seat, "crashed", emit_retired=False)
    if not started:
        raise NoWorker("the worker for this identity failed to start")
    assert seat.worker is not None
    seat.worker.identity = identity
