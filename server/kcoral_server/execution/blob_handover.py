"""A program's data outside its messages: blobs handed to the worker by descriptor, and the
captured output read back (SERVER §5, §14).

Both pick the loop or the executor by size (``offload.on_loop``): small copies and reads
are cheaper here than a thread hand-off, large ones must not stall the IO loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor

from kcoral_server.execution.control import RequestObserver
from kcoral_server.execution.drive import ProgramDrive
from kcoral_server.front_door.body import bytes_memfd, memfd_locations
from kcoral_server.front_door.offload import INLINE_BYTES, on_loop
from kcoral_server.pool.retirement import RunResult
from kcoral_server.processes import ipc
from kcoral_server.storage.workspace import NO_OUTPUT, CapturedOutput

__all__ = ["blob_slices", "read_output"]


async def blob_slices(
    blobs: Mapping[str, bytes | memoryview], executor: Executor | None
) -> tuple[list[ipc.BlobSlice], list[int], int | None]:
    """Blob locations for the worker: blobs inside a body memfd (this request's, or one
    the memory cache kept) by descriptor, other cached ones copied into a new memfd (the
    third value: the caller closes it once it is sent)."""
    located, fds, copies = memfd_locations(blobs)
    slices = [ipc.BlobSlice(*where) for where in located]
    extra_fd = None
    if copies:
        if on_loop(sum(len(memoryview(data)) for _, data in copies)):
            memfd, placed = bytes_memfd(copies)  # cheaper than a thread hand-off
        else:
            loop = asyncio.get_running_loop()
            memfd, placed = await loop.run_in_executor(executor, bytes_memfd, copies)
        extra_fd = memfd
        index = len(fds)
        fds.append(memfd)
        slices += [ipc.BlobSlice(sha, index, off, n) for sha, off, n in placed]
    return slices, fds, extra_fd


async def read_output(
    drive: ProgramDrive, observer: RequestObserver, executor: Executor | None
) -> CapturedOutput:
    """Drain live output (jobs), then read the response's output (finished programs, and
    those past their deadline, whose 504 carries it: EXTENSIONS §15)."""
    if drive.limit <= 0:
        return NO_OUTPUT
    await observer.output_finished()
    if drive.result not in (RunResult.FINISHED, RunResult.TIMED_OUT):
        return NO_OUTPUT
    # small output is read here: cheaper than a thread hand-off
    runs = drive.output_order  # EXTENSIONS §16: what the answer's output_order is made of
    output = drive.workspace.read_small_output(drive.limit, INLINE_BYTES, runs)
    if output is not None:
        return output
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, drive.workspace.read_output, drive.limit, runs)
