"""The state of one program on its worker while it runs, and how it ends (PROTOCOL §6–§7).

``ProgramDrive`` is what ``run.SeatRun`` learns from the worker's messages: the
returns, the last instruction started and finally one ``RunResult`` with the status, error
and reasons that the answer (``program_outcome``) and the worker's fate
(``Pool.retirement``) are decided from. Its methods turn each way a program ends into that
state; they never touch the worker.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kcoral.protocol.output_order import MAX_RUNS, runs_of
from kcoral.protocol.schema import Instruction, Return
from kcoral_server.execution.exit_cause import TIMEOUT_MESSAGE
from kcoral_server.execution.records import return_record
from kcoral_server.execution.responses import ReturnRecord
from kcoral_server.pool.retirement import RunResult
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import WorkerGone, close_fds
from kcoral_server.processes.output_order import Runs
from kcoral_server.processes.progress_slot import ProgressSlot
from kcoral_server.storage import workspace_watch
from kcoral_server.storage.workspace import Workspace

if TYPE_CHECKING:
    from kcoral_server.execution.control import RequestObserver

__all__ = ["CRASH_MESSAGE", "ProgramDrive", "instruction_error"]

CRASH_MESSAGE = "worker exited while executing the instruction"


@dataclass
class ProgramDrive:
    """Progress of one program on a worker."""

    workspace: Workspace
    limit: int
    result: RunResult | None = None  # None while the program runs
    status: str = "FAILED"
    error: dict[str, Any] | None = None
    returns: list[ReturnRecord] = field(default_factory=list)
    last_instruction: ipc.InstructionStarted | None = None
    reason: str = "server_error"
    reason_retire: str | None = None
    maps: list[mmap.mmap] = field(default_factory=list)
    instructions: Sequence[Instruction] = ()
    progress: ProgressSlot | None = None  # the worker's, when it has one
    #: the limit the worker died at, for the answer (``exit_cause.limit_cause``)
    cause: str | None = None
    #: the size of a message past what an answer carries (refused by the front-end, or not
    #: sent by the worker), if any: the answer is then 500 ``response_too_large``
    too_large: int | None = None
    timeout_message: str = TIMEOUT_MESSAGE  # the 504's, naming the deadline once known
    #: the worker's record of how stdout and stderr interleaved, in bytes (EXTENSIONS §16)
    output_order: Runs = field(default_factory=list)

    def use_slot(self, slot: ProgressSlot | None, observer: RequestObserver) -> None:
        """The worker's progress slot (None: it has none), reset for this program and lent
        to a live follower, which reads the worker's output runs there (EXTENSIONS §16)."""
        self.progress = slot
        if slot is not None:
            slot.reset()
            observer.output_record(slot)

    def read_progress(self) -> None:
        """Take the last instruction started from the progress slot (the program is over):
        without ``InstructionStarted`` frames this is the only record of it. A value that
        names no instruction of this program (uploaded code can write the slot) leaves what
        the frames said, if anything."""
        if self.progress is None:
            return
        index = self.progress.last_started(len(self.instructions))
        if index is None:
            return
        instruction = self.instructions[index]
        self.last_instruction = ipc.InstructionStarted(
            index=index,
            op=instruction.op,
            id=None if isinstance(instruction, Return) else instruction.id,
        )

    def read_order_record(self) -> None:
        """The worker is gone: its slot holds each switch of stream it made (EXTENSIONS
        §16), which reaches further than its last ``OutputOrder`` frame (sent at an
        instruction start), unless that frame says more."""
        if self.progress is not None:
            runs = self.progress.runs_since(0, MAX_RUNS)
            if len(runs) >= len(self.output_order):
                self.output_order = runs

    def returned(self, message: ipc.ReturnProduced | ipc.ReturnTooLarge, fds: list[int]) -> None:
        """A return the worker sent, or the size of one no answer could carry (the answer
        is then 500 ``response_too_large``); ``ValueError`` when it is malformed."""
        if isinstance(message, ipc.ReturnProduced):
            self.returns.append(return_record(message, fds, self.maps))
            return
        close_fds(fds)
        if type(message.length) is not int:
            raise ValueError("return_too_large without a length")
        self.too_large = message.length

    def order_reported(self, runs: object, fds: list[int]) -> None:
        """The worker's ``OutputOrder`` (EXTENSIONS §16): the program's own record to
        spoil, so a malformed one is dropped, never the program's failure."""
        close_fds(fds)
        self.output_order = list(runs_of(runs))

    def finished(self, message: ipc.ProgramFinished) -> None:
        """The worker's ``ProgramFinished``; ``ValueError`` when it is malformed."""
        if message.status not in ("COMPLETED", "FAILED"):
            raise ValueError(f"unknown program status {message.status!r}")
        if message.status == "FAILED" and not isinstance(message.error, dict):
            raise ValueError("FAILED without an error object")
        self.result = RunResult.FINISHED
        self.status = message.status
        self.error = message.error if message.status == "FAILED" else None
        if message.left_processes:
            self.reason_retire = "request_limit"
            if self.status == "COMPLETED" and self.last_instruction is not None:
                self.status = "FAILED"
                self.error = instruction_error(
                    self.last_instruction,
                    "program left background processes running; they were terminated",
                )
        if message.poisoned:
            self.reason_retire = "poisoned_context"
        self.reason = "completed" if self.status == "COMPLETED" else "program_failed"

    def failed_at_teardown(self, returncode: int) -> None:
        """A retiring worker exited with ``returncode`` after a completed program."""
        if self.status == "COMPLETED" and self.last_instruction is not None:
            self.status = "FAILED"
            self.reason = "program_failed"
            self.error = instruction_error(
                self.last_instruction, f"worker exited with code {returncode} during teardown"
            )

    def timed_out(self, message: str | None = None) -> None:
        """The program passed its deadline and its worker was killed."""
        self.read_order_record()  # its 504's output keeps its order (EXTENSIONS §15, §16)
        self.result = RunResult.TIMED_OUT
        if message is not None:
            self.timeout_message = message
        self.reason = "timeout"
        self.reason_retire = "timeout"

    def disk_limit_passed(self, limit: int) -> None:
        """The sandbox directory passed ``--workspace-limit-bytes``; the worker was killed."""
        self.read_progress()  # the process is gone: the slot holds its last word
        self.read_order_record()
        self.result = RunResult.FINISHED
        self.status = "FAILED"
        self.reason = "program_failed"
        self.reason_retire = workspace_watch.RETIRE_REASON
        if self.last_instruction is None and self.instructions:
            first = self.instructions[0]  # it wrote before it said anything: the first
            self.last_instruction = ipc.InstructionStarted(
                index=0, op=first.op, id=None if isinstance(first, Return) else first.id
            )
        if self.last_instruction is None:
            self.result = RunResult.CRASHED
            return
        self.error = instruction_error(self.last_instruction, workspace_watch.limit_message(limit))

    def cancelled(self, reason: str | None) -> None:
        self.result = RunResult.CANCELLED
        self.reason = reason or "cancelled"
        self.reason_retire = "cancelled"

    def worker_lost(self, gone: WorkerGone, quarantined: bool, cause: str | None = None) -> None:
        """The worker went away (or spoke garbage) before ``ProgramFinished``; ``cause`` is
        the limit it was killed at, when its cgroup says so."""
        self.read_progress()  # the process is gone: the slot holds its last word
        self.read_order_record()
        self.reason_retire = "crashed"
        self.cause = cause
        if quarantined:
            self.result = RunResult.QUARANTINED  # its GPU was taken out of service under it
        elif gone.invalid:
            self.result = RunResult.INVALID
            self.reason = "server_error"
            if gone.too_large is not None:
                self.too_large = gone.too_large.length
        elif self.last_instruction is not None:
            self.result = RunResult.FINISHED
            self.status = "FAILED"
            message = CRASH_MESSAGE if cause is None else f"{CRASH_MESSAGE}: {cause}"
            self.error = instruction_error(self.last_instruction, message)
            self.reason = "crashed"
        else:
            self.result = RunResult.CRASHED
            self.reason = "crashed"


def instruction_error(instruction: ipc.InstructionStarted, message: str) -> dict[str, Any]:
    return {
        "kind": "runtime",
        "message": message,
        "instruction_index": instruction.index,
        "instruction_op": instruction.op,
        "instruction_id": instruction.id,
        "traceback": "",
    }
