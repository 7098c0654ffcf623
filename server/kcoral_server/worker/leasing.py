"""The worker's side of the per-GPU lease (PROTOCOL §6.2, SERVER §5).

The front-end arbitrates: the worker sends ``LeaseAcquire`` and blocks until
``LeaseGranted``; ``LeaseRelease`` needs no reply. In cpu mode the lease is disabled and
no lease message is ever sent.
"""

from __future__ import annotations

import os
import time

from kcoral.bench.deadline import postpone_program_deadline
from kcoral_server.processes.ipc import (
    BlockingChannel,
    IpcError,
    LeaseAcquire,
    LeaseGranted,
    LeaseRelease,
    LeaseWithdrawn,
    Shutdown,
)
from kcoral_server.worker.failures import InstructionFailure

#: a session program interrupted while it waited for its GPUs (EXTENSIONS §11)
WITHDRAWN_MESSAGE = (
    "KeyboardInterrupt: interrupted while it waited for its GPUs "
    "(another program held them); the instruction did not run"
)


class WorkerExit(Exception):
    """The front-end asked the worker to stop (or went away) while it was waiting."""


class WaitWithdrawn(InstructionFailure):
    """The front-end withdrew the wait for the lease: the program was interrupted before it
    got the GPUs (EXTENSIONS §11), and the instruction that waited fails so. Not held:
    everything it ran on them before was drained when it gave them back."""

    def __init__(self) -> None:
        super().__init__("runtime", WITHDRAWN_MESSAGE)


class Lease:
    def __init__(self, channel: BlockingChannel, enabled: bool) -> None:
        self.channel = channel
        self.enabled = enabled
        self.held = False

    def acquire(self) -> None:
        """Hold the lease (blocking until granted); a no-op when held or disabled."""
        if not self.enabled or self.held:
            return
        self.channel.send(LeaseAcquire())
        asked = time.monotonic()
        try:
            message, fds = self.channel.receive()
        except EOFError:
            raise WorkerExit("channel closed while waiting for the lease") from None
        for fd in fds:  # nothing legitimate carries fds here
            _close(fd)
        if isinstance(message, Shutdown):
            raise WorkerExit("shutdown while waiting for the lease")
        if isinstance(message, LeaseWithdrawn):
            raise WaitWithdrawn
        if not isinstance(message, LeaseGranted):
            raise IpcError(f"expected lease_granted, got {message.tag}")
        self.held = True
        # the front-end's deadline pauses while a program waits for its lease (SERVER §8)
        postpone_program_deadline(time.monotonic() - asked)

    def acquire_unless_withdrawn(self) -> bool:
        """``acquire``; False where the front-end withdrew the wait instead (a teardown
        after an interrupt: it has nothing on the GPUs to drain)."""
        try:
            self.acquire()
        except WaitWithdrawn:
            return False
        return True

    def release(self) -> None:
        """Give the lease back (the caller drained GPU work first); no-op when not held."""
        if not self.enabled or not self.held:
            return
        self.channel.send(LeaseRelease())
        self.held = False

    def forget(self) -> None:
        """The front-end took the lease over (it does so after ``ProgramFinished``)."""
        self.held = False


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
