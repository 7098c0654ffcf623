"""Where the front-end's per-request work runs: on the event loop or in the executor.

Handing work to a thread costs front-end CPU (a future, a wake-up of the loop, the thread's
own switch) that small work never earns back: below ``INLINE_BYTES`` parsing and hashing a
body, resolving its blobs, copying cached blobs into a memfd and reading a program's output
run on the loop; above it, in the executor so that the loop keeps serving other requests.
``benchmarks/perf.py`` measures the difference ("front-end CPU per trivial request"): on
the 2-core development machine (2026-12, two alternating runs) handing all of it off cost
1.60 / 1.20 ms per trivial request against 1.30 / 0.90 ms with this threshold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

INLINE_BYTES = 64 * 1024

#: Blobs of a large body are hashed in executor tasks of about this many bytes. One task
#: per blob made an ``upload_folder`` of 20,000 small files 20,000 hand-offs, each a wake-up
#: of the event loop: seconds of front-end time for a few MiB (benchmarks/send_files.py).
#: A blob this large or larger still gets a task of its own, so big blobs hash in parallel.
HASH_TASK_BYTES = 1 << 20

Data = TypeVar("Data", bound=bytes | bytearray | memoryview)


def on_loop(nbytes: int) -> bool:
    """Whether work over ``nbytes`` bytes is cheaper on the event loop than handed off."""
    return nbytes <= INLINE_BYTES


def hash_tasks(
    blobs: Mapping[str, Data], task_bytes: int = HASH_TASK_BYTES
) -> list[dict[str, Data]]:
    """``blobs`` split into groups to hash in one executor task each: consecutive blobs
    until a group holds ``task_bytes``; every blob in exactly one group."""
    tasks: list[dict[str, Data]] = []
    group: dict[str, Data] = {}
    size = 0
    for digest, data in blobs.items():
        group[digest] = data
        size += memoryview(data).nbytes
        if size >= task_bytes:
            tasks.append(group)
            group, size = {}, 0
    if group:
        tasks.append(group)
    return tasks
