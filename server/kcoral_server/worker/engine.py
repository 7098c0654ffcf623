"""Runs one program: from ``RunProgram`` through its instructions to teardown and ``Outcome``.

PROTOCOL §5–§7 and SERVER §6–§9. What each instruction does (and where the lease is taken
for it) is ``instructions.Instructions``; ``ProgramExecution`` drives it and tears the
program down under the lease (§6.3). The engine talks to the front-end only through the
channel: ``InstructionStarted`` before each instruction, lease messages where §6.2 puts
them, one ``ReturnProduced`` per successful return (sent at once, so a later crash keeps
it), and finally a ``ProgramFinished`` built by the caller from ``Outcome``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from kcoral.bench.deadline import set_program_deadline
from kcoral.protocol.schema import Instruction, Return
from kcoral.protocol.strict_json import loads_strict
from kcoral_server.processes.ipc import (
    BlockingChannel,
    Configure,
    InstructionStarted,
    ProgramFinished,
    RunProgram,
)
from kcoral_server.processes.output_order import OutputOrder
from kcoral_server.processes.progress_slot import ProgressSlot
from kcoral_server.worker import context
from kcoral_server.worker.blobs import BlobMaps
from kcoral_server.worker.capture import OutputCapture, flush_c_stdio
from kcoral_server.worker.confinement import clear_workspace, empty_private_tmp
from kcoral_server.worker.cupti_guard import GpuAccessFailure, finalize_cupti
from kcoral_server.worker.event_loop import WorkerLoop
from kcoral_server.worker.failures import (
    Attribution,
    InstructionFailure,
    error_object,
    exception_text,
)
from kcoral_server.worker.instructions import Instructions
from kcoral_server.worker.leasing import Lease, WorkerExit
from kcoral_server.worker.leftovers import leftover_threads, live_threads, thread_message
from kcoral_server.worker.libraries import Libraries
from kcoral_server.worker.reaper import kill_descendants
from kcoral_server.worker.runtime import CpuRuntime, CudaFault, GpuRuntime
from kcoral_server.worker.state import InterruptGate, ProcessSnapshot

LEFTOVER_MESSAGE = "program left background processes running; they were terminated"
# Survivors of each clean-up are frozen out of the collector (torch alone is hundreds of
# thousands of objects); a periodic full pass still finds cycles among frozen objects. That
# pass walks every object: ~40-80 ms of CPU in a worker that preloaded torch, which every
# 100 programs was most of a trivial program's worker CPU. It comes every
# FULL_COLLECTION_EVERY programs while it is cheap, and is spaced out as it gets dearer so
# it costs about FULL_COLLECTION_SHARE_SECONDS per program, never rarer than
# FULL_COLLECTION_MAX_SPACING programs.
FULL_COLLECTION_EVERY = 100
FULL_COLLECTION_SHARE_SECONDS = 25e-6
FULL_COLLECTION_MAX_SPACING = 2000


def full_collection_spacing(seconds: float) -> int:
    """Programs until the next full pass, after one that took ``seconds`` of CPU."""
    wanted = math.ceil(seconds / FULL_COLLECTION_SHARE_SECONDS)
    return min(max(wanted, FULL_COLLECTION_EVERY), FULL_COLLECTION_MAX_SPACING)


def _parse(program_json: str) -> Any:
    from kcoral.protocol.validate import parse_program  # written by the protocol engineer

    return parse_program(loads_strict(program_json))


@dataclass
class Outcome:
    status: str
    error: dict[str, Any] | None
    left_processes: bool
    poisoned: bool
    lease_held: bool
    gpu_access_at: float | None = None

    def message(self) -> ProgramFinished:
        return ProgramFinished(
            status=self.status,
            error=self.error,
            left_processes=self.left_processes,
            poisoned=self.poisoned,
            lease_held=self.lease_held,
            gpu_access_at=self.gpu_access_at,
        )


class Engine:
    """Per-worker state that outlives programs: the event loop, loaded libraries."""

    def __init__(
        self,
        channel: BlockingChannel,
        runtime: CpuRuntime | GpuRuntime,
        lease: Lease,
        configure: Configure,
        snapshot: ProcessSnapshot | None,
        interrupts: InterruptGate,
    ) -> None:
        self.channel = channel
        self.interrupts = interrupts  # SIGINT reaches uploaded code only
        self.runtime = runtime
        self.lease = lease
        self.configure = configure
        self.snapshot = snapshot
        # EXTENSIONS §3: one loop per worker process, made when a program first needs it
        self.event_loop = WorkerLoop()
        self.libraries = Libraries(runtime.library_unavailable)
        self.unsettled: ProgramExecution | None = None  # outcome sent, slow clean-up still due
        self.programs = 0
        self.next_full_collection = FULL_COLLECTION_EVERY  # a program count
        self.modules_after_settle = len(sys.modules)  # to see a program that imported some
        # shared with the front-end (progress_slot.ProgressSlot); arrives with the first program
        self.progress: ProgressSlot | None = None
        # sys.modules and the path importers as a program starts: copied again only after
        # a program changed them (a copy of a torch worker's ~1,100 modules is ~40 us). One
        # that went stale between programs only makes the next comparison take the loop.
        self.modules_seen: dict[str, Any] = {}
        self.importers_seen: set[Any] = set()
        if not configure.transient:  # a one-shot worker has no next program to protect
            self.remember_modules()

    def remember_modules(self) -> None:
        self.modules_seen = dict(sys.modules)
        self.importers_seen = set(sys.path_importer_cache)

    def attach_progress(self, fd: int) -> None:
        """Use the progress slot memfd ``fd`` (closed here) from now on."""
        try:
            slot = ProgressSlot.attach(fd)
        except (OSError, ValueError):
            return  # without a slot every instruction is reported by frame instead
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.progress is not None:
            self.progress.close()
        self.progress = slot

    def run(self, request: RunProgram, fds: list[int]) -> Outcome:
        if not self.settle():  # a caller that never settled still gets a clean process
            raise WorkerExit  # ... or none: a sandbox workspace that would not empty
        run = ProgramExecution(self, request, fds)
        outcome = run.execute()
        self.unsettled = run
        return outcome

    def settle(self) -> bool:
        """The slow part of teardown, done after ``ProgramFinished`` went out and before
        ``WorkerReady`` (the seat, and the GPU lease, stay busy until then). False when
        the sandbox's workspace would not empty: the worker must not take another program.

        Emptying the workspace and the private ``/tmp`` is here, after the answer, because
        what a program left there cannot change its outcome (issue 31: before, every
        sandboxed request waited for it). A one-shot worker never settles: it exits, and
        its seat's next worker starts in an emptied workspace and empties ``/tmp`` itself."""
        run, self.unsettled = self.unsettled, None
        if run is None:
            return True
        clean = True
        if self.configure.sandbox == "bubblewrap":
            # §14: the sandbox keeps one workspace (kill_descendants already ran: nothing of
            # the program's still writes there)
            clean = clear_workspace(run.request.workspace)
            empty_private_tmp()  # /tmp, /var/tmp, /dev/shm: tmpfs only the worker reaches
        self.programs += 1
        full = self.programs >= self.next_full_collection
        # A program that left modules behind (a session's first ``import torch``) made
        # objects that live as long as the process, as start-up's do. Collecting all of them
        # now took ~0.8 s (torch), and the next program waits for this clean-up: a session's
        # next cell showed it as its queue time on an idle server (issue 29.9). So only the
        # young generations, where a program's short-lived garbage is, are collected then,
        # and the rest is frozen with the modules until the periodic full pass.
        imported = len(sys.modules) > self.modules_after_settle
        took = run.settle(full_collection=full, young_only=imported and not full)
        self.modules_after_settle = len(sys.modules)
        if full:
            self.next_full_collection = self.programs + full_collection_spacing(took)
        return clean


class ProgramExecution:
    """One program from ``RunProgram`` to its ``Outcome``."""

    def __init__(self, engine: Engine, request: RunProgram, fds: list[int]) -> None:
        self.engine = engine
        self.request = request
        self.fds = fds
        self.channel = engine.channel
        self.runtime = engine.runtime
        self.lease = engine.lease
        self.instructions = Instructions(engine, request.max_response_bytes)
        self.last: Attribution | None = None  # last instruction that started
        self.exiting = False  # the front-end went away or asked us to stop
        self.error: dict[str, Any] | None = None
        self.left_processes = False
        self._poisoned = False  # see ``poisoned``
        self.gpu_access_at: float | None = None  # monotonic time of a cpu_only CUDA call
        self.settled = False
        self.progress: ProgressSlot | None = None  # set by ``execute``
        self.report_instructions = True
        self.capturing = False  # fds 1 and 2 go to the front-end's capture files
        self.capture: OutputCapture | None = None
        self.order_sent: list[list[int]] = []  # the output order last reported
        self.threads_before = live_threads()  # threads it starts must end with it
        # only modules that appear (or change) during the program can come from its workspace
        # (the engine's copies, not taken anew per program: see ``Engine.modules_seen``)
        self.modules_before = engine.modules_seen
        self.importers_before = engine.importers_seen

    @property
    def poisoned(self) -> bool:
        """The worker must not run another program: a sticky device fault, an unconfirmed
        clean-up or a workspace it could not empty."""
        return self._poisoned or self.instructions.poisoned

    # ------------------------------------------------------------------ driver

    def execute(self) -> Outcome:
        request = self.request
        capture = None
        startup_failure: Exception | None = None
        capture_fds, progress_fd = self._take_own_fds()
        if progress_fd is not None:
            self.engine.attach_progress(progress_fd)
        # frames only when someone follows the program live (or there is no slot to write)
        self.progress = self.engine.progress
        self.report_instructions = request.report_instructions or self.progress is None
        if request.stdout_path is not None and request.stderr_path is not None:
            try:
                if capture_fds:
                    capture = OutputCapture(capture_fds[0], capture_fds[1], self.progress)
                else:
                    capture = OutputCapture(request.stdout_path, request.stderr_path, self.progress)
            except OSError as exc:  # the front-end's capture files are unusable
                startup_failure = exc
        self.capturing = capture is not None
        self.capture = capture
        for fd in capture_fds:  # now duplicated onto fds 1 and 2
            with contextlib.suppress(OSError):
                os.close(fd)
        # the benchmark helpers stop sampling before it (EXTENSIONS §12.1)
        set_program_deadline(request.deadline_seconds)
        context.current = context.RequestContext(
            request_id=request.request_id,
            device=self.runtime.device,
            workspace=request.workspace,
            serialization=request.serialization,
            allowed_serialization=tuple(self.engine.configure.allowed_serialization),
        )
        try:
            try:
                with self.engine.interrupts.program():
                    self._run_instructions(startup_failure)
            finally:
                self._teardown()
        finally:
            context.current = None
            set_program_deadline(None)
            if capture is not None:
                capture.restore()
        self._report_output_order()  # the whole record, before ``ProgramFinished``
        outcome = Outcome(
            status="FAILED" if self.error is not None else "COMPLETED",
            error=self.error,
            left_processes=self.left_processes,
            poisoned=self.poisoned,
            lease_held=self.lease.held,
            gpu_access_at=self.gpu_access_at,
        )
        self.lease.forget()  # after ProgramFinished the lease is the front-end's business
        return outcome

    def _take_own_fds(self) -> tuple[list[int], int | None]:
        """The frame's descriptors that are not blobs (they follow the blob fds): the capture
        files a sandboxed worker receives instead of paths, and the progress slot."""
        fds = self.fds
        capture = self.request.capture_fds
        if len(capture) != 2 or not all(0 <= i < len(fds) for i in capture):
            capture = []
        progress = self.request.progress_fd
        if progress is None or not 0 <= progress < len(fds) or progress in capture:
            progress = None
        taken = {*capture, progress}
        self.fds = [fd for i, fd in enumerate(fds) if i not in taken]
        return [fds[i] for i in capture], None if progress is None else fds[progress]

    def _output_sizes(self) -> list[int] | None:
        """The bytes of stdout and stderr written so far: the front-end lets out only these
        before the phase of the instruction about to start, whose own output follows it
        (EXTENSIONS §5). Our ``sys.stdout``/``stderr`` write through, so the files hold it."""
        if not self.capturing:
            return None
        try:
            return [os.fstat(1).st_size, os.fstat(2).st_size]
        except OSError:
            return None

    def _report_output_order(self) -> None:
        """How stdout and stderr interleaved so far, where that changed and both were
        written (EXTENSIONS §16): once before ``ProgramFinished``; and, for a worker without
        a progress slot, before each instruction's frame, whose phase lets out the output
        written before it in this order, kept by the front-end if we crash. Not per
        instruction with a slot: each frame holds every run so far, so a program of many
        instructions writing both streams sent a quadratic amount of them."""
        if self.capture is None:
            return
        try:
            runs = self.capture.runs_at_end
            if runs is None:  # the program runs on
                runs = self.capture.order.runs_so_far()
            runs = [[int(stream), int(end)] for stream, end in runs]
        except (TypeError, ValueError):
            return  # the program spoiled its own record: its answer goes without one
        if len(runs) > 1 and runs != self.order_sent:
            self.channel.send(OutputOrder(runs=runs))
            self.order_sent = runs

    def _run_instructions(self, startup_failure: Exception | None = None) -> None:
        try:
            if startup_failure is not None:
                raise startup_failure
            self.instructions.workspace_fd = os.open(
                self.request.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
            os.chdir(self.request.workspace)
            self.instructions.blobs = BlobMaps(self.request.blobs, self.fds)
            self.fds = []
            program = _parse(self.request.program_json)
        except Exception as exc:
            for fd in self.fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            where = self._first_attribution()
            self._fail(
                InstructionFailure("engine", f"cannot start the program: {exception_text(exc)}"),
                where,
            )
            return
        for instruction in program.instructions:
            where = Attribution(instruction.index, instruction.op, _instruction_id(instruction))
            previous, self.last = self.last, where
            if self.progress is not None:
                self.progress.started(where.index)
            else:
                # the slot holds each switch of stream as it happens; without one, the runs
                # so far go before the instruction's frame, for its phase and a crash
                self._report_output_order()
            if self.report_instructions:
                self.channel.send(
                    InstructionStarted(where.index, where.op, where.id, self._output_sizes())
                )
            try:
                self.instructions.step(instruction, previous)
            except WorkerExit:
                self.exiting = True
                raise
            except InstructionFailure as failure:
                self._fail(failure, failure.where or where)
                return
            except Exception as exc:  # a fault of the worker itself, not of uploaded code
                self._fail(
                    InstructionFailure(
                        "engine", f"internal error: {exception_text(exc)}", _own_traceback(exc)
                    ),
                    where,
                )
                return

    def _first_attribution(self) -> Attribution:
        try:
            first = json.loads(self.request.program_json)["instructions"][0]
            op = first.get("op") if isinstance(first.get("op"), str) else "upload"
            ident = first.get("id") if isinstance(first.get("id"), str) else None
            return Attribution(0, op, ident)
        except Exception:
            return Attribution(0, "upload", None)

    def _fail(self, failure: InstructionFailure, where: Attribution) -> None:
        self.error = error_object(failure.kind, failure.message, where, failure.traceback)
        if isinstance(failure, GpuAccessFailure):
            self.error.update(failure.fields)
            # for the front-end, which alone knows who held the GPU then
            self.gpu_access_at = failure.observed_at

    # ------------------------------------------------------------------ teardown

    def _teardown(self) -> None:
        """§6.3: under the lease drain the device, drop everything, restore the process."""
        last = self.last or self._first_attribution()
        if self.exiting:
            self._cleanup_process()
            return  # the worker exits now; its caller kills what the program left
        try:
            # False: interrupted before it held the GPUs again, so nothing of it is on them
            on_device = self.lease.acquire_unless_withdrawn()
        except WorkerExit:
            self.exiting = True
            self._cleanup_process()
            raise
        if on_device:
            self._record_fault(self.runtime.drain(), last)
        self._cancel_pending_tasks()
        self._cleanup_process()
        on_gpu = on_device and self.runtime.device == "gpu"
        if on_gpu and not self.poisoned and self.error is not None:
            self._record_fault(self.runtime.check_context(), last)
        found, verified = kill_descendants()
        if found:
            self.left_processes = True
            if self.error is None:
                self.error = error_object("runtime", LEFTOVER_MESSAGE, last, "")
        if not verified:
            self._poisoned = True
        threads = leftover_threads(self.threads_before, self.engine.event_loop.created)
        if threads:  # a thread cannot be killed: the worker retires (as for processes)
            self.left_processes = True
            if self.error is None:
                self.error = error_object("runtime", thread_message(threads), last, "")

    def _record_fault(self, fault: CudaFault | None, last: Attribution) -> None:
        if fault is None:
            return
        if fault.sticky:
            self._poisoned = True
            if self.error is None:
                self.error = error_object("runtime", fault.message, last, "")
        elif self.error is not None and self.error["kind"] == "gpu_access":
            self.error["message"] += f"; CUDA also reports {fault.message}"
        else:
            self.error = error_object("runtime", fault.message, last, "")

    def _cancel_pending_tasks(self) -> None:
        loop = self.engine.event_loop.created
        if loop is None:
            return  # no loop was made: no task can be pending
        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=5))
        except BaseException:  # a task that refuses to die must not break teardown
            pass

    def _cleanup_process(self) -> None:
        """The part of clean-up the outcome waits for: what the program's output and the
        leftover-process check depend on. ``settle`` does the rest."""
        self.instructions.close()
        # here, not in settle: the front-end deletes the workspace once it has the outcome
        # (a one-shot worker exits instead: no next program could import them)
        if not self.engine.configure.transient and _drop_workspace_modules(
            self.request.workspace, self.modules_before, self.importers_before
        ):
            self.engine.remember_modules()
        self.modules_before = {}
        self.importers_before = set()
        flush_c_stdio()
        if self.exiting:
            self.settle()

    def settle(self, *, full_collection: bool = False, young_only: bool = False) -> float:
        """Restore the process, collect garbage (``young_only``: generations 0 and 1),
        detach CUPTI (idempotent). Returns the CPU seconds the collection took."""
        if self.settled:
            return 0.0
        self.settled = True
        if self.engine.snapshot is not None:  # None: a one-shot worker, which exits instead
            self.engine.snapshot.restore()  # environment, cwd, sys.path, torch settings, ...
        started = time.thread_time()
        if full_collection:
            gc.unfreeze()
        gc.collect(1 if young_only else 2)
        gc.freeze()
        took = time.thread_time() - started
        finalize_cupti()  # SERVER §6: CUPTI is detached between reused requests
        self.runtime.after_program()
        return took


def _instruction_id(instruction: Instruction) -> str | None:
    return None if isinstance(instruction, Return) else instruction.id


def _own_traceback(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8192:]


def _drop_workspace_modules(
    workspace: str, before: dict[str, Any], importers_before: set[Any]
) -> bool:
    """Forget modules a program imported from its workspace (it is deleted afterwards).

    Only modules added or replaced since ``before``, and path importers added since
    ``importers_before``, are examined (the workspace is new to every program), by string
    prefix: ``realpath`` on every module of a process that loaded torch cost ~0.5 s per
    program, and the workspace's own ``realpath`` is only taken when something is new.
    True when something was new (the snapshots are then out of date)."""
    try:
        # one C-level comparison (values by identity first): usually nothing changed
        unchanged = sys.modules == before
    except Exception:  # a value with its own failing __eq__ (anything can be put there)
        unchanged = False
    changed = (
        []
        if unchanged
        else [name for name, module in sys.modules.items() if before.get(name) is not module]
    )
    importers = [
        key for key in sys.path_importer_cache.keys() - importers_before if isinstance(key, str)
    ]
    if not changed and not importers:
        return False
    roots = tuple({os.path.realpath(workspace) + os.sep, os.path.abspath(workspace) + os.sep})
    for name in changed:
        module = sys.modules.get(name)
        filename = getattr(module, "__file__", None)
        if not isinstance(filename, str):
            continue
        if not os.path.isabs(filename):  # relative to the program's cwd: resolve it once
            filename = os.path.realpath(filename)
        if filename.startswith(roots):
            sys.modules.pop(name, None)
    for key in importers:
        if (key + os.sep).startswith(roots):
            sys.path_importer_cache.pop(key, None)
    return True
