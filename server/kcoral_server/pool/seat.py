"""A seat of the pool and where it is in its worker's life (SERVER.md §4).

A seat (``cpu/w<i>`` or ``gpu<N>/w<i>``) outlives its processes: ``generation`` counts the
workers it has had, ``served`` the programs its current worker ran. Only the pool moves a
seat from one state to the next.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kcoral_server.processes.handle import WorkerHandle
from kcoral_server.processes.launch import SeatSandbox


class SeatState(enum.Enum):
    """Where a seat is in its worker's life."""

    STARTING = "starting"  # its first worker is starting
    IDLE = "idle"  # its worker is ready for a program
    BUSY = "busy"  # checked out, or its worker is cleaning up after a program
    REPLACING = "replacing"  # a new worker is being started (with back-off)
    FAILED = "failed"  # its worker failed to start; a replacement follows
    QUARANTINED = "quarantined"  # the pool stopped admitting: no new worker
    CLOSED = "closed"  # the pool is shutting down


#: the states in which a seat counts in ``request_capacity`` (it has a live worker)
SERVING = (SeatState.IDLE, SeatState.BUSY)


@dataclass
class GpuDevice:
    """One configured GPU: physical id, UUID when known, arch (``sm_90a``)."""

    id: int
    uuid: str = ""
    arch: str = ""


@dataclass
class Seat:
    id: str
    #: the seat's GPU; a session's seat: the first of its pinned set, which its worker's
    #: ``gpu_ids`` (and the lease) hold in full (EXTENSIONS §11)
    gpu_id: int | None
    generation: int = 0
    worker: WorkerHandle | None = None
    state: SeatState = SeatState.STARTING
    served: int = 0
    assigned: bool = False
    replacement: asyncio.Task | None = field(default=None, repr=False)
    #: under bubblewrap: the sandbox (and fork server) its workers share, one identity's
    sandbox: SeatSandbox | None = field(default=None, repr=False)
    #: a session's seat (EXTENSIONS §11): outside ``seats``; the session takes each release
    pinned: Callable[[str | None], None] | None = field(default=None, repr=False)
    #: the worker started ahead for the seat's next program (``Pool`` keeps one per stateless
    #: seat when every worker serves one program, SERVER §6): launched while the current
    #: worker runs, in the seat's other sandbox, and configured (CUDA) only when it takes over
    spare: WorkerHandle | None = field(default=None, repr=False)
    spare_start: asyncio.Task | None = field(default=None, repr=False)
    #: under bubblewrap: the sandbox of the spare, never the running program's; the two
    #: change places when the spare takes over
    spare_sandbox: SeatSandbox | None = field(default=None, repr=False)
    #: the worker after the spare, forked ahead on a CPU seat once the spare is ready, in
    #: the current worker's sandbox: held in its cgroups before it runs anything (no code,
    #: no memory of its own) until it becomes the spare, when that directory is emptied
    #: (moving into a cgroup waits ~10 ms for the kernel, SERVER §6)
    held: WorkerHandle | None = field(default=None, repr=False)
    held_start: asyncio.Task | None = field(default=None, repr=False)
    #: a CPU seat's previous worker, handed over at its exit report (SERVER §6): this task
    #: ends once it is killed and can run no more code; the seat's next spare (in its sandbox
    #: directory) and next hand-over wait for that
    departure: asyncio.Task | None = field(default=None, repr=False)
    #: the kills of such workers until their ends are confirmed (shutdown awaits them)
    leaving: set[asyncio.Task] = field(default_factory=set, repr=False)


def seats_for(
    mode: str, gpus: list[GpuDevice], num_workers: int, workers_per_gpu: int
) -> list[Seat]:
    """The pool's seats: ``num_workers`` in CPU mode, else ``workers_per_gpu`` per GPU."""
    if mode == "cpu":
        return [Seat(f"cpu/w{i}", None) for i in range(num_workers)]
    return [Seat(f"gpu{gpu.id}/w{i}", gpu.id) for gpu in gpus for i in range(workers_per_gpu)]


def seat_to_take(seats: list[Seat], handed: Sequence[Seat] = ()) -> Seat | None:
    """The idle seat a request takes now (SERVER §4): one on the GPU with the fewest requests
    assigned (spreads requests across GPUs; ``handed``: seats just handed over, counted as
    assigned). None when no seat is idle, or when a GPU with fewer requests has no idle seat
    but one about to be ready (its worker being replaced, or cleaning up after a program):
    the request waits for that one rather than for the lease of a GPU a program holds (team
    soak: a program waited 24.9 s for alice's while the other GPU was replacing workers).
    A seat whose start failed (``FAILED``, backing off) is not about to be ready. Among
    idle seats equally loaded, one whose worker was forked after its launcher's preload
    (SERVER §1) goes first."""
    taken = {s.id for s in handed}
    load: dict[int | None, int] = {}
    for s in seats:
        load[s.gpu_id] = load.get(s.gpu_id, 0) + (1 if s.assigned or s.id in taken else 0)
    idle = [s for s in seats if s.state is SeatState.IDLE and s.id not in taken]
    if not idle:
        return None
    # Among equals, a worker forked after its launcher's preload: one forked before it
    # imports torch itself (2 s on the quick tour's first program, beside a ready one).
    best = min(idle, key=lambda s: (load[s.gpu_id], -len(preloaded(s.worker))))
    with_idle = {s.gpu_id for s in idle}
    coming = [load[s.gpu_id] for s in seats if s.gpu_id not in with_idle and _coming(s, taken)]
    return None if coming and min(coming) < load[best.gpu_id] else best


def preloaded(handle: WorkerHandle | None) -> tuple[str, ...]:
    """The modules ``handle``'s launcher had preloaded when it forked it (none: spawned, or
    no worker)."""
    return getattr(getattr(handle, "process", None), "preloaded", ())


def _coming(seat: Seat, taken: set[str]) -> bool:
    """Whether ``seat`` will be idle soon: a worker starting, or one cleaning up after its
    program (busy, no request assigned, not just handed over)."""
    if seat.state in (SeatState.STARTING, SeatState.REPLACING):
        return True
    return seat.state is SeatState.BUSY and not seat.assigned and seat.id not in taken
