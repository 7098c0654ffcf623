"""Run a built cell on a server: live through the jobs API, or blocking without it.

The jobs path (EXTENSIONS.md §5) submits the program, follows its events (phases, stdout,
stderr) and fetches the result; interrupting cancels the job. Servers whose ``/v1/info``
does not list ``jobs`` get one blocking ``Client.execute`` (an interrupt closes the
connection, which cancels the work there, EXTENSIONS §9). Failures become exceptions the
notebook shows with the remote traceback. No IPython import: progress goes to a ``Reporter``.

Only the public client API is used (``Client.execute``/``submit`` with ``serialization=``,
``Job.events``/``result``/``status``/``cancel``, ``Session.interrupt``), and request errors
are told apart by their status and kind, never by the server's wording.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import FrameType, TracebackType
from typing import Any, Protocol

from kcoral import (
    Client,
    Job,
    KCoralError,
    Program,
    ProgramResult,
    ProtocolError,
    RemoteExecutionError,
    TransportError,
)
from kcoral.client_sessions import Session as ClientSession
from kcoral.run.terminal_filter import screened
from kcoral_jupyter.cell_errors import (
    CellCancelledError,
    CellTimeoutError,
    PickleRefusedError,
)
from kcoral_jupyter.cell_program import BuiltCell
from kcoral_jupyter.job_clock import JobClock, events_with_ticks
from kcoral_jupyter.submission import submitted_live

#: Where a cell's program goes: the server (stateless), or the kernel's session there (the
#: two share ``execute`` and ``submit``, EXTENSIONS §11).
Target = Client | ClientSession


class Reporter(Protocol):
    """Where a running cell reports to (the magic's status line and output streams)."""

    def phase(self, text: str) -> None: ...

    def finished(self, text: str) -> None:
        """The job's last phase (``done (STATUS)``); the line that follows says its status."""

    def tick(self, text: str) -> None:
        """The same phase said again, a later time in it (a front end that prints each
        line once need not)."""

    def stdout(self, text: str) -> None: ...

    def stderr(self, text: str) -> None: ...

    def note(self, text: str) -> None:
        """A note of the extension's, on a line of its own after the cell's output."""


class CutStreams(Protocol):
    """What says which streams the output limit cut: a result, or a timeout's prints."""

    @property
    def stdout_truncated(self) -> bool: ...

    @property
    def stderr_truncated(self) -> bool: ...


def truncation_note(output: CutStreams, limit: int | None) -> str:
    """What the streams the output limit cut say ("" for none): the limit and how to move
    it, in one note for both (two ~200-character notes said the same)."""
    cut = [name for name in ("stdout", "stderr") if getattr(output, f"{name}_truncated")]
    if not cut:
        return ""
    said = f"{limit} bytes" if limit is not None else "the server's default"
    streams = " and ".join(cut) + (" were" if len(cut) == 2 else " was")
    return (
        f"[kcoral: {streams} truncated at the output limit ({said} per stream); raise it "
        "with --output-limit BYTES or %config KCoral.output_limit = BYTES (the server caps "
        "it at its max_output_limit_bytes, see %kcoral status)]\n"
    )


@dataclass(frozen=True)
class ExecuteOptions:
    timeout_seconds: float | None = None
    output_limit_bytes: int | None = None
    gpu_count: int | None = None
    serialization: str | None = None
    select: str | None = None  # a selector's canonical text (EXTENSIONS, selectors)

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "timeout_seconds": self.timeout_seconds,
            "output_limit_bytes": self.output_limit_bytes,
            "gpu_count": self.gpu_count,
            "serialization": self.serialization,
            # only when given: a cell without one sends what it always sent
            **({"select": self.select} if self.select is not None else {}),
        }


@dataclass
class RunRecord:
    """What we learned about one run, for the summary line and output provenance."""

    server: str
    job_id: str | None = None
    worker_id: str | None = None
    gpu_ids: tuple[int, ...] = ()
    streamed: bool = False  # stdout/stderr already shown while it ran
    device: str | None = None
    target: dict[str, str] = field(default_factory=dict)
    wall_ms: float = 0.0
    # Said in warning style on the summary line (an explicit --gpus that ran on a CPU server).
    warning: str | None = None
    output_limit_bytes: int | None = None  # what the cell asked for (None: the server's)
    session_id: str | None = None  # the session the cell ran in (EXTENSIONS §11)
    # What a queued cell waits for: its --select, else the router's default kind
    # ("gpu=h100", from /v1/info fleet); None when not known (a direct server).
    waits_for: str | None = None
    gpu_count: int = 1  # the GPUs its lease takes at once (a cell's --gpus)
    #: how its interrupted session job was seen to end (None: not seen to end)
    session_program: InterruptedProgram | None = None


class RemoteCellError(RemoteExecutionError):
    """A cell failed on the server; IPython shows the remote traceback, not ours."""

    def __init__(
        self, result: ProgramResult, record: RunRecord | None = None, *, hint: str = ""
    ) -> None:
        super().__init__(result)
        if record is not None and record.job_id:
            # Named by its job, the id the panel, %kcoral jobs and attach show; the request
            # id the client's message names is shown nowhere in a notebook.
            error = result.error or {}
            self.args = (
                screened(
                    f"job {record.job_id} on {record.server} failed: "
                    f"{error.get('kind')}: {error.get('message')}"
                ),
            )
        self.record = record
        self.hint = hint  # one line after the remote traceback (e.g. a forgotten -i NAME)

    def _render_traceback_(self) -> list[str]:
        error = self.result.error or {}
        lines = [f"{type(self).__name__}: {self}"]
        remote = _without_wrapper_frames(str(error.get("traceback") or "").rstrip())
        # With no frame of the cell's own left (the wrapper's check of an -o name after the
        # cell ran), it would only repeat the first line under an internal exception name.
        if any(line.startswith('  File "') for line in remote.splitlines()):
            lines += ["", "Remote traceback:", *remote.splitlines()]
        if self.hint:
            lines += ["", self.hint]
        # The server writes the message and the traceback (a malicious one, anything), and
        # IPython on a terminal prints these lines as they are: screened as a cell's output
        # is (kcoral.run.terminal_filter), so no clipboard write or status query gets through.
        return screened("\n".join(lines)).split("\n")


def missing_input_hint(result: ProgramResult, kernel_names: Collection[str]) -> str:
    """For a remote ``NameError`` on a name the kernel has but the cell did not send: the
    ``-i NAME`` that sends it ("" otherwise)."""
    error = result.error or {}
    text = f"{error.get('message') or ''}\n{error.get('traceback') or ''}"
    match = re.search(r"NameError: name '([A-Za-z_][A-Za-z0-9_]*)' is not defined", text)
    if match is None or match.group(1) not in kernel_names:
        return ""
    name = match.group(1)
    return (
        f"hint: {name!r} exists in this kernel but the cell runs on the server: "
        f"send it with -i {name}"
    )


def _without_wrapper_frames(traceback: str) -> str:
    """Drop the generated wrapper's frames: the user wrote the cell, not the wrapper."""
    lines = traceback.splitlines()
    kept: list[str] = []
    skip_source = False
    for line in lines:
        if skip_source:
            # The frame's source line and Python 3.11's caret lines are indented deeper.
            if line.startswith("    "):
                continue
            skip_source = False
        if line.startswith('  File "<uploaded:'):
            skip_source = True
            continue
        kept.append(line)
    return "\n".join(kept)


def server_features(client: Client) -> list[str]:
    """The ``/v1/info`` feature list; a server without ``/v1/info`` has none."""
    try:
        info = client.info()
    except KCoralError:
        return []
    features = info.get("features")
    return [f for f in features if isinstance(f, str)] if isinstance(features, list) else []


def run_cell(
    client: Target,
    built: BuiltCell,
    options: ExecuteOptions,
    reporter: Reporter,
    *,
    record: RunRecord,
    use_jobs: bool,
) -> ProgramResult:
    """Run ``built.program``; return the result (``COMPLETED`` or ``FAILED``) or raise a
    cell exception for a request-level failure."""
    started = time.monotonic()
    if isinstance(client, ClientSession):  # a restarted router's wait, on the status line
        client.on_wait = reporter.phase
    try:
        if use_jobs:
            result = _run_as_job(client, built.program, options, reporter, record)
        else:
            reporter.phase("running (this server has no jobs API: output comes at the end)")
            result = client.execute(built.program, **options.as_kwargs())
    except KCoralError as exc:
        if exc.output is not None and not record.streamed:
            # what the cell printed before its deadline (EXTENSIONS §15), then the error
            for stream, text in exc.output.output_in_order():  # as written (EXTENSIONS §16)
                (reporter.stdout if stream == "stdout" else reporter.stderr)(text)
            note = truncation_note(exc.output, record.output_limit_bytes)
            if note:  # as a finished cell's: the server cut what it printed
                reporter.note(note)
        raise translate_error(exc, options, record.server) from None
    finally:
        record.wall_ms = (time.monotonic() - started) * 1000.0
        if isinstance(client, ClientSession):
            client.on_wait = None  # a later status read is no cell's: stderr
    if result.gpu_ids:
        record.gpu_ids = tuple(result.gpu_ids)
    return result


def _run_as_job(
    client: Target, program: Program, options: ExecuteOptions, reporter: Reporter, record: RunRecord
) -> ProgramResult:
    job: Job | None = None
    try:
        # inside the try: an interrupt just after the held one is let go (before the job's
        # id was noted) must stop the job too; it escaped, and the job ran on
        with HeldInterrupt() as held:  # a second interrupt abandons the submission
            job = submitted_job(client, program, options, reporter, record)
        record.job_id = job.id
        reporter.phase("submitted")
        if held.noted:  # it came while the job was submitted: stopped now that it has an id
            raise KeyboardInterrupt
        result = follow_job(job, reporter, record, clock=JobClock(job.id, time.monotonic()))
    except KeyboardInterrupt:
        if job is None:
            raise  # a second interrupt during the submission: the caller says so
        record.job_id = job.id
        if isinstance(client, ClientSession):
            # Cancelling a session's job kills its worker and so the session's state
            # (EXTENSIONS §11); an interrupt raises KeyboardInterrupt in the program instead.
            reporter.phase("interrupted: raising KeyboardInterrupt in the session's program")
            if stop_session_program(client, job):
                record.session_program = how_it_ended(job)
                reporter.phase(f"interrupted: {record.session_program.value}")
            raise
        reporter.phase("interrupted: cancelling the job on the server")
        try:
            job.cancel()
        finally:
            reporter.phase(f"cancelled job {record.job_id} (kernel state kept)")
        raise
    _merge_job_state(job, record)
    return result


def submitted_job(
    client: Target, program: Program, options: ExecuteOptions, reporter: Reporter, record: RunRecord
) -> Job:
    """``client.submit``'s job; meanwhile a router's hold is said on ``reporter`` with its
    time, and a large upload's progress (``submission``)."""
    return submitted_live(
        lambda: client.submit(program, **options.as_kwargs()),
        reporter,
        record.waits_for,
        client_waits_said_by(client),
    )


def client_waits_said_by(client: Target) -> Callable[[Callable[[str], None] | None], None] | None:
    """What sets where a session says its own waits (a restarted router's) while it submits
    (``submitted_live``; ``None`` puts back where it said them before); ``None`` for a
    server, which says none."""
    if not isinstance(client, ClientSession):
        return None
    before = client.on_wait

    def said_by(say: Callable[[str], None] | None) -> None:
        client.on_wait = before if say is None else say

    return said_by


class HeldInterrupt:
    """Holds the kernel's interrupt (SIGINT) while a cell's job is submitted. One raised
    there could land after the server took the job and before its id came back: the job
    then ran on with nothing to cancel it by, and the cell said it was cancelled. The first
    interrupt is noted (``noted``), and the caller cancels the job once it has its id; a
    second one raises ``KeyboardInterrupt`` at once (a long upload, a router holding the
    submission), and the caller says the job may have started. Outside the main thread
    (where no signal handler can be set) it holds nothing."""

    def __init__(self) -> None:
        self.noted = False
        self._previous: Any = None
        self._holding = False

    def __enter__(self) -> HeldInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._interrupted)
            self._holding = True
        return self

    def _interrupted(self, _signum: int, _frame: FrameType | None) -> None:
        if self.noted:
            raise KeyboardInterrupt
        self.noted = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._holding:
            signal.signal(signal.SIGINT, self._previous)
            self._holding = False


#: An interrupted session cell waits this long per round for its program to stop (the server
#: gives it 5 s, then kills the worker, EXTENSIONS §11), and sends the interrupt again each
#: round: one that came while the program was still queued stopped nothing. Waiting means the
#: next cell finds the session idle instead of busy (409).
INTERRUPT_ROUND_SECONDS = 6.0
INTERRUPT_ROUNDS = 5


def stop_session_program(session: ClientSession, job: Job) -> bool:
    """Interrupt the session's running ``job`` until it has finished (``True``); ``False``
    when it still runs after every round. A second interrupt from the user stops waiting."""
    try:
        for _ in range(INTERRUPT_ROUNDS):
            session.interrupt()
            try:
                job.wait(timeout=INTERRUPT_ROUND_SECONDS)
                return True
            except TimeoutError:
                continue
    except (KeyboardInterrupt, KCoralError, TransportError):
        pass  # the interrupt is what the cell reports; the next cell meets what is left
    return False


class InterruptedProgram(Enum):
    """How an interrupted session cell's program ended (its value: the phase line)."""

    STOPPED = "the session's program has stopped"  # KeyboardInterrupt raised in it
    #: cancelled while it waited to start (EXTENSIONS §11)
    NEVER_RAN = "the session's program never ran"
    #: it completed all the same: the interrupt came as it finished, or it caught it
    COMPLETED = "the session's program completed all the same"


def how_it_ended(job: Job) -> InterruptedProgram:
    """How the finished ``job`` of an interrupted session cell ended. Its cell said
    'KeyboardInterrupt raised in' a program that never ran (cancelled before it reached a
    worker: no ``started_at``) or that completed, its changes kept."""
    try:
        state = job.status()
    except (KCoralError, TransportError, ProtocolError):
        return InterruptedProgram.STOPPED  # not known: what the cell said before
    if state.get("status") == "COMPLETED":
        return InterruptedProgram.COMPLETED
    if state.get("status") == "CANCELLED" and state.get("started_at") is None:
        return InterruptedProgram.NEVER_RAN
    return InterruptedProgram.STOPPED


def follow_job(
    job: Job, reporter: Reporter, record: RunRecord, *, clock: JobClock | None = None
) -> ProgramResult:
    """Show a job's phases and output as they happen, then fetch its result (the one event
    loop of the notebook layer: running cells and ``%kcoral attach`` both use it). With a
    ``clock`` the line says how long its job has waited or run, ticking between events
    (``attach``'s counts from the job's own times: its events replay at once)."""
    events = job.events()
    ticking = events_with_ticks(events, clock.seconds_to_tick) if clock else events
    for event in ticking:
        if event is None:  # no event for a tick: the same phase, a later time
            if clock is not None:
                reporter.tick(clock.line())
        elif event.kind in ("stdout", "stderr"):
            if event.text:
                record.streamed = True
                (reporter.stdout if event.kind == "stdout" else reporter.stderr)(event.text)
        elif event.kind == "phase":
            text = describe_phase(event.data, record)
            if text and clock is not None:
                text = clock.phase(event.data, text)
            if text:
                (reporter.finished if event.finished else reporter.phase)(text)
            if event.finished:
                break
    return job.result()


def describe_phase(data: Mapping[str, Any], record: RunRecord) -> str | None:
    """The status-line text of one ``phase`` event."""
    phase = data.get("phase") or data.get("name")
    if phase == "queued":
        # ``position`` counts the requests ahead (EXTENSIONS §5): 0 is next in line, which
        # "queued #0" made read like a queue on an idle server.
        position = data.get("position")
        wanted = f", waiting for {record.waits_for}" if record.waits_for else ""
        if isinstance(position, int) and position > 0:
            return f"queued behind {position}{wanted}"
        return f"waiting for {record.waits_for}" if record.waits_for else "waiting for a worker"
    if phase == "assigned":
        record.worker_id = str(data.get("worker_id") or "") or record.worker_id
        return f"worker {record.worker_id}"
    # A --gpus 2 cell waits for both GPUs at once, and a user who reads "waiting for GPU"
    # while one of them is free wonders what it waits for.
    gpus = "GPU" if record.gpu_count == 1 else f"{record.gpu_count} GPUs"
    if phase == "lease_wait":
        return f"waiting for {gpus}"
    if phase == "lease_held":
        return f"running on {gpus}"
    if phase == "instruction":
        return describe_instruction(str(data.get("op")), str(data.get("id") or ""), data)
    if phase == "finished":
        return f"done ({data.get('status')})"
    return None


def describe_instruction(op: str, ident: str, data: Mapping[str, Any]) -> str:
    """What an instruction of a cell's program does, in the cell's words (the ids are the
    ones ``cell_program.build_cell`` gives); a program of other origin gets its op and id."""
    if ident.startswith("in:") and ident != "in:pickled":
        return f"sending {ident.removeprefix('in:')}"
    if ident == "in:pickled":
        return "sending the pickled inputs"
    if ident in ("cell_module", "cell_function"):
        return "loading the cell"
    if ident == "cell":
        return "running"
    if op.startswith("return"):
        return "returning the results"
    if op == "upload":  # a --file's or --folder's bytes came with the submission
        return "writing the sent files"
    verb = {"upload": "uploading", "get_function": "loading", "run": "running"}.get(op, op)
    return f"instruction {data.get('index')}: {verb} {ident}".rstrip()


def _merge_job_state(job: Job, record: RunRecord) -> None:
    try:
        state = job.status()
    except KCoralError:  # the job expired meanwhile: the result is what counts
        return
    record.worker_id = state.get("worker_id") or record.worker_id
    ids = state.get("gpu_ids")
    # the server's word: kept only when every entry is a GPU index (an int >= 0, not a bool)
    if isinstance(ids, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        record.gpu_ids = tuple(ids)


#: how the server's ``409 cancelled`` starts; what follows names who or why (EXTENSIONS §5)
CANCELLED_BY_THE_SERVER = "the job was cancelled"


def translate_error(exc: KCoralError, options: ExecuteOptions, server: str) -> BaseException:
    """A request-level failure as the exception a notebook user can act on (two lines:
    cause, what to do); other HTTP errors are returned as they are (the magic shortens them)."""
    if exc.kind == "timeout":
        limit = options.timeout_seconds
        said = f"--timeout {limit:g} s" if limit is not None else "the server's default timeout"
        return CellTimeoutError(
            f"the cell ran past its execution deadline ({said}) on {server} "
            f"[request {exc.request_id}]",
            "raise it with --timeout SECONDS or %config KCoral.timeout = SECONDS (the server "
            "clamps it to its max_timeout_seconds, see %kcoral status)",
        )
    # A cell's program is built by us, so a 400 "parse" for a cell sent with pickle is the
    # server refusing the format (EXTENSIONS §4); the server's message is quoted, not read.
    if exc.status_code == 400 and exc.kind == "parse" and options.serialization == "pickle":
        return PickleRefusedError(
            f"{server} does not allow pickle ({exc.message})",
            "pass --in values that are tensors, bytes or JSON values, or ask the operator to "
            "allow pickle (KCORAL_ALLOWED_SERIALIZATION)",
        )
    if exc.kind == "cancelled":
        # Not by this cell: its own interrupt is told where it is caught (magics/cell.py),
        # so the interrupt advice of ``cancelled`` does not fit here.
        said = exc.message.removeprefix(CANCELLED_BY_THE_SERVER)
        if said != exc.message and said:
            # the server named who (``by admin root``) or why (a revoked token): keep it
            return CellCancelledError(
                f"the job was cancelled on {server}{said}", "run the cell again"
            )
        return CellCancelledError(
            f"the job was cancelled on {server}, not by this cell",
            "a Cancel in the KCoral panel, %kcoral cancel or another client of the server "
            "stopped it; run the cell again",
        )
    return exc


def cancelled(cause: str) -> CellCancelledError:
    """An interrupt or a cancel as the two lines the user sees (still a KeyboardInterrupt)."""
    return CellCancelledError(
        cause, "run the cell again; --noblock runs it as a job that an interrupt leaves alone"
    )
