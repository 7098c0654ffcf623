"""Records made from a running program's worker messages (PROTOCOL §6.4, §7.6).

A ``ReturnProduced`` becomes a ``ReturnRecord`` whose parts are views of the worker's
return memfd; a ``gpu_access`` error names the request that held the GPU when the
``cpu_only`` call entered CUDA. The worker runs uploaded code: every field and descriptor
it sends is checked here (``ValueError`` for what does not fit, mapped to ``invalid worker
response`` by the caller), never trusted.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from kcoral_server.execution.responses import ReturnRecord
from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import close_fds
from kcoral_server.processes.handle import WorkerHandle
from kcoral_server.storage.event_log import EventLog

__all__ = ["MAP_FLAGS", "output_sizes", "record_gpu_access", "return_record"]

# Return memfds are mapped prefaulted (64 MiB = 16,384 separate faults otherwise).
MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def return_record(
    message: ipc.ReturnProduced, fds: list[int], maps: list[mmap.mmap]
) -> ReturnRecord:
    """The return's record, its parts mapped from its memfd (the map joins ``maps``, closed
    with the answer); the descriptors are closed."""
    lengths = [int(n) for n in message.part_lengths]
    if any(n < 0 for n in lengths) or len(fds) != (1 if lengths else 0):
        close_fds(fds)
        raise ValueError("return parts do not match their descriptor")
    parts: list[memoryview] = []
    if fds:
        total = sum(lengths)
        try:
            size = os.fstat(fds[0]).st_size
            if size < total:
                raise ValueError("return memfd is shorter than its parts")
            if total:
                mapped = mmap.mmap(fds[0], total, flags=MAP_FLAGS, prot=mmap.PROT_READ)
                maps.append(mapped)
                view = memoryview(mapped)
                offset = 0
                for n in lengths:
                    parts.append(view[offset : offset + n])
                    offset += n
            else:
                parts = [memoryview(b"") for _ in lengths]
        finally:
            close_fds(fds)
    if not isinstance(message.node, dict) or not isinstance(message.key, str):
        raise ValueError("return node is not an object")
    return ReturnRecord(message.key, message.node, parts)


def record_gpu_access(
    error: dict[str, Any],
    at: float | None,
    handle: WorkerHandle,
    *,
    request_id: str,
    arbiter: LeaseArbiter | None,
    events: EventLog,
) -> None:
    """PROTOCOL §7.6: name the request that held this GPU when the cpu_only call entered
    CUDA (null when none, or itself), from the arbiter's holder history; log it."""
    interfered = None
    if arbiter is not None and at is not None:
        for gpu in handle.gpu_ids:
            holder = arbiter.request_at(gpu, float(at))
            if holder is not None and holder != request_id:
                interfered = holder
                break
    error["interfered_request_id"] = interfered
    events.emit(
        "gpu_access_violation",
        "WARNING",
        request_id=request_id,
        worker_id=handle.seat_id,
        gpu_id=handle.gpu_ids[0] if handle.gpu_ids else None,
        instruction_id=error.get("instruction_id"),
        cuda_call=error.get("cuda_call"),
        location=error.get("location"),
        interfered_request_id=interfered,
    )


def output_sizes(message: ipc.InstructionStarted) -> tuple[int, int] | None:
    """The stdout and stderr bytes the program had written when the instruction started
    (``None`` when the worker captures no output)."""
    sizes = message.output_sizes
    if sizes is None:
        return None
    if type(sizes) is not list or len(sizes) != 2 or not all(type(n) is int for n in sizes):
        raise ValueError("instruction_started: output_sizes is not two integers")
    if min(sizes) < 0:
        raise ValueError("instruction_started: negative output size")
    return sizes[0], sizes[1]
