"""The worker handles a pool makes (``Pool.handles``): a seat's own worker (on the seat's
GPU, in the seat's sandbox), a session's worker (on its pinned GPU set, EXTENSIONS §11) and
a GPU-set request's transient one (PROTOCOL §6.5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.pool.seat import GpuDevice, Seat
from kcoral_server.processes.handle import WorkerHandle
from kcoral_server.processes.launch import SeatSandbox
from kcoral_server.settings.config import ServerConfig
from kcoral_server.storage.event_log import EventLog


@dataclass
class HandleMaker:
    """What every handle of one pool shares; ``make`` is ``WorkerHandle`` (unit tests of
    the pool's decisions pass a stand-in)."""

    make: Callable[..., WorkerHandle]
    mode: str  # "cpu", "gpu" or "fake-gpu"
    config: ServerConfig
    events: EventLog
    arbiter: LeaseArbiter | None
    sandbox: str
    allowed_serialization: Sequence[str]
    seats: int
    on_gone: Callable[[WorkerHandle], None]
    gpus: Sequence[GpuDevice] = ()  # the pool's

    def gpu_device(self, gpu_id: int | None) -> GpuDevice | None:
        return next((g for g in self.gpus if g.id == gpu_id), None)

    def for_seat(self, seat: Seat, *, spare: bool = False) -> WorkerHandle:
        """The seat's next worker (a new generation), on the seat's GPU, in the seat's
        sandbox. It is transient when every worker serves one request: it exits right after
        its outcome instead of cleaning up for a next program it will never get (the
        pipeline waits for that exit).

        ``spare``: the worker started ahead for the seat's next program (``Pool``), in the
        seat's other sandbox; its generation is the next one, and becomes the seat's when
        it takes over."""
        gpu = self.gpu_device(seat.gpu_id)
        generation = seat.generation + 1
        if not spare:
            seat.generation = generation
        sandbox = seat.spare_sandbox if spare else seat.sandbox
        if self.sandbox == "bubblewrap" and sandbox is None:
            sandbox = SeatSandbox(
                config=self.config,
                device=self.mode,
                gpu_ids=[gpu.id] if gpu else [],
                seats=self.seats,
            )
            if spare:
                seat.spare_sandbox = sandbox
            else:
                seat.sandbox = sandbox
        return self._seat_worker(seat, generation, sandbox)

    def for_seat_after_next(self, seat: Seat) -> WorkerHandle | None:
        """The worker after the seat's spare, to be forked ahead (``SpareWorkers``): in the
        sandbox of the seat's current worker, which it gets once that worker is gone (the
        spare takes over and the two sandboxes change places). None under bubblewrap while
        the seat has no sandbox."""
        if self.sandbox == "bubblewrap" and seat.sandbox is None:
            return None
        # its generation is set again when it becomes the spare
        return self._seat_worker(seat, seat.generation + 2, seat.sandbox)

    def _seat_worker(
        self, seat: Seat, generation: int, sandbox: SeatSandbox | None
    ) -> WorkerHandle:
        """A worker of the seat (on its GPU) with ``generation``, in ``sandbox``."""
        gpu = self.gpu_device(seat.gpu_id)
        return self.make(
            **self._shared(seat),
            generation=generation,
            gpu_ids=[gpu.id] if gpu else [],
            gpu_uuids=[gpu.uuid] if gpu and gpu.uuid else [],
            transient=self.config.max_requests_per_worker == 1,
            on_gone=self.on_gone,
            seats=self.seats,
            seat_sandbox=sandbox,
        )

    def for_session(self, seat: Seat, gpu_ids: Sequence[int]) -> WorkerHandle:
        """A session's worker on the pool's GPUs ``gpu_ids``, in that order
        (``for_pinned_set``); the session starts and retires it."""
        gpus = [gpu for gpu_id in gpu_ids for gpu in self.gpus if gpu.id == gpu_id]
        return self.for_pinned_set(seat, gpus)

    def for_pinned_set(self, seat: Seat, gpus: Sequence[GpuDevice]) -> WorkerHandle:
        """A session's worker (EXTENSIONS §11), built for the GPU set pinned to its seat
        (``gpus``, in the order its programs see them; empty on a CPU server). It is kept
        between programs, and each program takes the lease on the whole set, as a
        stateless worker takes it on its one GPU (SERVER §5)."""
        seat.generation += 1
        gpu_ids = [gpu.id for gpu in gpus]
        if self.sandbox == "bubblewrap" and seat.sandbox is None:
            # the sandbox exposes exactly the set's device nodes
            seat.sandbox = SeatSandbox(
                config=self.config, device=self.mode, gpu_ids=gpu_ids, seats=self.seats
            )
        uuids = [gpu.uuid for gpu in gpus]
        return self.make(
            **self._shared(seat),
            generation=seat.generation,
            gpu_ids=gpu_ids,
            gpu_uuids=uuids if all(uuids) else [],  # ids alone when any UUID is unknown
            transient=False,
            on_gone=self.on_gone,
            seats=self.seats,
            seat_sandbox=seat.sandbox,
        )

    def for_gpu_set(self, seat: Seat) -> WorkerHandle:
        """A transient worker for a GPU-set request that borrowed ``seat``; it leases its
        GPUs (``WorkerHandle.take_gpu_set``) before it starts, and is killed while holding
        them."""
        return self.make(
            **self._shared(seat),
            generation=seat.generation,
            gpu_ids=[],
            gpu_uuids=[],
            transient=True,
        )

    def _shared(self, seat: Seat) -> dict[str, Any]:
        return {
            "seat_id": seat.id,
            "device": self.mode,
            "arbiter": self.arbiter,
            "sandbox": self.sandbox,
            "log_programs": self.config.log_programs,
            "allowed_serialization": list(self.allowed_serialization),
            "config": self.config,
            "events": self.events,
        }
