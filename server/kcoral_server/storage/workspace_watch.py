"""The disk one sandboxed program may fill (README "Limits"; SERVER §14; issue 28 point 8).

Who can reach what: a *program* under bubblewrap can write only its sandbox directory on
the host (the workspace ``/work`` and its runtime state: ``HOME``, caches, ``TMPDIR``) and
the sandbox's ``/tmp``, ``/var/tmp`` and ``/dev/shm``, which are sized tmpfs charged to its
memory cgroup (``sandbox.SandboxDir.command``). The sandbox directory is plain disk: without
a bound one program filled the host's disk for every seat and the front-end. While a
program runs, the front-end measures that directory (``--workspace-limit-bytes``) and,
past the bound, kills the worker and answers with a message that names the limit.

Without a sandbox a program can write wherever the server's user can: nothing here bounds
it (README says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

from kcoral_server.execution.exit_cause import size_text

#: a measurement at most this often, and never more than a tenth of the time (a program
#: that made a huge tree makes every walk long)
CHECK_INTERVAL_SECONDS = 1.0
RETIRE_REASON = "disk_limit"


def disk_usage(root: Path, stop_above: int = 0) -> int:
    """Bytes allocated under ``root`` (symbolic links not followed, other mounts not
    entered); stops counting once past ``stop_above`` (0: counts all)."""
    total = 0
    pending = [str(root)]
    try:
        device = os.lstat(root).st_dev
    except OSError:
        return 0
    while pending:
        directory = pending.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue  # gone meanwhile, or a program took its permissions away
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_dev != device:
                    continue
                # allocated blocks, not the apparent size: a sparse file takes no disk
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
        if stop_above and total > stop_above:
            break
    return total


def limit_message(limit: int) -> str:
    return (
        f"the program's workspace passed its disk limit of {size_text(limit)} "
        "(--workspace-limit-bytes) and its worker was killed"
    )


class WorkspaceWatch:
    """Measures one sandbox directory while a program runs; calls ``on_exceeded`` once
    when it holds more than ``limit`` bytes."""

    def __init__(
        self, root: Path, limit: int, executor: Executor | None, on_exceeded: Callable[[], None]
    ) -> None:
        self.root = root
        self.limit = limit
        self.exceeded = False
        self._executor = executor
        self._on_exceeded = on_exceeded
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        # The first measurement after one interval, not at once: a program that has only
        # just started has written nothing yet, and one walk (an executor hop and a scan of
        # HOME and the caches) on every request was front-end CPU that only sandboxed
        # requests paid (issue 31's sandbox tax). A timer rather than a sleeping task: a
        # program shorter than the interval costs one timer and its cancel. What a reused
        # worker's earlier program left is measured by the next measurement all the same.
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(CHECK_INTERVAL_SECONDS, self._begin)

    def _begin(self) -> None:
        self._timer = None
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = time.monotonic()
            used = await loop.run_in_executor(self._executor, disk_usage, self.root, self.limit)
            if used > self.limit:
                self.exceeded = True
                self._on_exceeded()
                return
            took = time.monotonic() - began
            await asyncio.sleep(max(CHECK_INTERVAL_SECONDS, 10 * took))
