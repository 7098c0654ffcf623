"""``%%kcoral``: run a cell on a KCoral server.

The cell path: parse options (``options.cell_parser``) → build the program (``cell_program``)
→ run it (``runner``) with a status line that a display handle updates in place → bind
``--out`` values, show returned files, return the final expression's value. Every output
carries provenance in its metadata under the key ``kcoral``.

Who can reach what (a malicious server): what a server sends is shown as text or escaped
into our own markup; only the ``--out`` names bind into the namespace (``read_outcome``
refuses the rest), and HTML the server authored appears only in a sandboxed iframe.

While the kernel holds a session (``%kcoral session``, EXTENSIONS §11), cells run in its
worker's ``kcoral.session.namespace`` (``CellSpec.in_session``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from kcoral import Job, KCoralError, ProgramResult, ProtocolError, TransportError
from kcoral.bench.history import remember_benchmarks
from kcoral_jupyter import display as rich
from kcoral_jupyter.cell_errors import (
    CellCancelledError,
    CellTimeoutError,
    GpuRequiredError,
    TwoLineError,
    shorten,
)
from kcoral_jupyter.cell_program import BuiltCell, CellSpec, build_cell, read_outcome, split_mapping
from kcoral_jupyter.kernel_state import KernelState, PendingJob, ServerFacts, normalize_url
from kcoral_jupyter.magics.options import cell_parser, join_name_lists, names, split_words
from kcoral_jupyter.magics.status_line import StatusLine, provenance, summary_text
from kcoral_jupyter.notebook_session import (
    LOCAL_SERVER_GONE,
    NotebookSession,
    after_stop_hint,
    ended_error,
    ended_with_cell_hint,
    interrupted_status,
    session_ended_under,
    session_interrupted,
    session_refusal,
    session_unreachable,
)
from kcoral_jupyter.runner import (
    ExecuteOptions,
    RemoteCellError,
    RunRecord,
    Target,
    cancelled,
    missing_input_hint,
    run_cell,
    submitted_job,
    translate_error,
    truncation_note,
)
from kcoral_jupyter.settings import KCoral

#: What a cell interrupted twice while its job was submitted says: the server may have it.
SUBMISSION_ABANDONED = (
    "the server may have started it; %kcoral jobs lists your jobs, %kcoral cancel ID stops one"
)
#: What an explicit ``--gpus`` on a server without GPUs says, in warning style.
CPU_WARNING = "ran on CPU (this server has no GPU)"


def interrupted_line(shell: Any) -> str:
    """The status line of a cell whose remote work an interrupt cancelled. Jupyter also
    interrupts a kernel before it shuts it down or restarts it, and ipykernel's shutdown
    request sets ``exit_now``: then the kernel's state goes with it, and is not "kept"."""
    if shell.exit_now:
        return "interrupted by the kernel's shutdown or restart; the remote work was cancelled"
    return "interrupted; the remote work was cancelled (kernel state kept)"


class CellMagic:
    """``%%kcoral [options]``: one cell's run, from its options to its bound values."""

    def __init__(self, shell: InteractiveShell, kernel: KernelState) -> None:
        self.shell = shell
        self.kernel = kernel

    def run(self, line: str, cell: str) -> Any:
        args = cell_parser().parse(join_name_lists(split_words(line, "%%kcoral")))
        gpus = args.gpus if args.gpus is not None else 1
        if gpus < 1 or gpus > 8:
            raise UsageError("%%kcoral: --gpus must be from 1 to 8")
        if args.result_name and not args.noblock:
            raise UsageError("%%kcoral: -r NAME goes with --noblock")
        settings = self.kernel.settings
        timeout, output_limit = cell_limits(args, settings)
        remote = self.kernel.sessions.active()
        if remote is not None:
            self._check_session_cell(remote, args.url, gpus)
            if args.select is not None:
                raise UsageError(
                    f"%%kcoral: {remote.label}'s cells run on its node; --select is given to "
                    "%kcoral session start"
                )
        built, spec = self._build(args, cell, in_session=remote is not None)

        url = remote.url if remote is not None else self.kernel.resolve_url(args.url)
        try:
            facts = self.kernel.facts(url)
        except TransportError as exc:  # a session's server: ending the session is the way out
            raise (self._session_refusal(exc, remote) or shorten(exc, url)) from exc
        except KCoralError as exc:
            raise shorten(exc, url) from exc  # named by its address, as a cell's own failure
        # With --select through a router the node is the router's choice: the server's
        # facts describe its default kind, not the node that will run the cell, so they
        # decide nothing here. A direct server runs the cell itself, selector or not (before,
        # --gpus 2 --select gpu=cpu on a CPU server got its 400 "exceeds this GPU server's
        # configured capacity" and --require-gpu ran on the CPU).
        selected = args.select is not None and facts.router
        if not selected and facts.gpu_count == 0 and (args.require_gpu or settings.require_gpu):
            said = "--require-gpu" if args.require_gpu else "KCoral.require_gpu"
            raise GpuRequiredError(
                f"{url} has no GPU and {said} asks for one: the cell did not run",
                "connect to a GPU server (%kcoral connect URL), or drop --require-gpu / "
                "%config KCoral.require_gpu = False to run on CPU",
            )
        if gpus > 1 and facts.gpu_count < gpus and remote is None and not selected:
            raise UsageError(
                f"%%kcoral: --gpus {gpus} needs a server with at least {gpus} GPUs; "
                # "has 4 GPUs (sm_90a)", not "has 4 (4 GPUs (sm_90a))"
                f"{url} has {facts.label if facts.gpu_count else f'0 ({facts.label})'}"
            )
        options = ExecuteOptions(
            timeout_seconds=timeout,
            output_limit_bytes=output_limit,
            # A session's GPUs were chosen at its start: its programs name none.
            gpu_count=gpus if gpus > 1 and remote is None else None,
            serialization=built.serialization,
            select=args.select,
        )
        client: Target = self.kernel.client(url) if remote is None else remote.handle
        has_jobs = "jobs" in facts.features
        record = RunRecord(
            server=url,
            target=facts.target,
            device=facts.device,
            # Who asked for a GPU must never take CPU timings for GPU ones (the default
            # --gpus 1 of every cell says nothing: only an explicit one warns).
            warning=(
                CPU_WARNING
                if args.gpus is not None and facts.gpu_count == 0 and not selected
                else None
            ),
            output_limit_bytes=options.output_limit_bytes,
            session_id=remote.id if remote is not None else None,
            waits_for=waits_for(args.select, facts) if remote is None else None,
            gpu_count=options.gpu_count or 1,
        )
        line_out = StatusLine(
            not (args.quiet or settings.quiet), record, local_server=self.kernel.is_local(url)
        )

        if args.noblock:
            return self._submit(client, built, options, record, args, has_jobs, line_out, remote)
        use_jobs = settings.use_jobs and has_jobs

        try:
            result = run_cell(client, built, options, line_out, record=record, use_jobs=use_jobs)
        except KeyboardInterrupt as exc:
            if isinstance(exc, TwoLineError):  # cancelled elsewhere (the panel's Cancel)
                ended = session_ended_under(remote)
                if ended is not None:  # the session's Stop: not "run the cell again"
                    line_out.show(ended.cause, status="ERROR")
                    raise ended from exc
                line_out.show(exc.cause, status="CANCELLED")
                raise
            if remote is not None:
                outcome = session_interrupted(remote, record)
                if not isinstance(outcome, CellCancelledError):  # ended: outlived its grace
                    line_out.show(outcome.cause, status="ERROR")
                    raise outcome from exc
                line_out.show(interrupted_status(remote, record))
                raise outcome from exc
            if use_jobs and record.job_id is None:  # interrupted twice while submitted
                line_out.show(f"interrupted while submitting; {SUBMISSION_ABANDONED}")
                raise cancelled(
                    f"interrupted while the cell was submitted to {url}: {SUBMISSION_ABANDONED}"
                ) from exc
            line_out.show(interrupted_line(self.shell))
            raise cancelled(f"interrupted: the cell's remote work on {url} was cancelled") from exc
        except Exception as exc:
            badge = "TIMED_OUT" if isinstance(exc, CellTimeoutError) else "ERROR"  # as the job
            line_out.metadata = provenance(None, record, status=badge)
            refusal = self._session_refusal(exc, remote)
            if refusal is not None:
                line_out.show(refusal.cause, status="ERROR")
                raise refusal from exc
            short = shorten(exc, url)
            line_out.show(
                short.cause if isinstance(short, TwoLineError) else f"{type(exc).__name__}: {exc}",
                status=badge,
            )
            if short is exc:
                raise
            raise short from exc
        value = self.finish(result, built, record, facts, line_out)
        self.remember_benchmarks(args.bench_label, value, spec.outputs)
        return value

    def remember_benchmarks(self, label: str | None, value: Any, outputs: Sequence[str]) -> None:
        """Keep the benchmark results among the cell's value and ``--out`` names in the
        notebook's history (EXTENSIONS §12.6): after the cell, or after ``%kcoral attach``
        of its ``--noblock`` job."""
        bound = [value, *(self.shell.user_ns.get(name) for name in outputs)]
        for note in remember_benchmarks(label, bound, self.shell.user_ns):
            print(note)

    def _build(
        self, args: argparse.Namespace, cell: str, *, in_session: bool
    ) -> tuple[BuiltCell, CellSpec]:
        inputs = {}
        for name in [n for text in args.inputs for n in names(text)]:
            if name not in self.shell.user_ns:
                raise UsageError(f"%%kcoral: --in {name}: no such name in the kernel")
            inputs[name] = self.shell.user_ns[name]
        try:
            spec = CellSpec(
                source=cell,
                inputs=inputs,
                outputs=[n for text in args.outputs for n in names(text)],
                files=[split_mapping(text, "--file") for text in args.files],
                folders=[split_mapping(text, "--folder") for text in args.folders],
                return_files=list(args.return_files),
                return_folders=list(args.return_folders),
                numpy=args.numpy,
                torch=args.torch,
                in_session=in_session,
            )
            return build_cell(spec), spec
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"%%kcoral: {exc}") from None

    def finish(
        self,
        result: ProgramResult,
        built: BuiltCell,
        record: RunRecord,
        facts: ServerFacts,
        line_out: StatusLine | None,
    ) -> Any:
        """Show a finished program's output and bind its ``--out`` values (also for a job
        that ``%kcoral attach`` followed); the cell's value, or ``RemoteCellError``."""
        meta = provenance(result, record)
        out = line_out if line_out is not None else StatusLine(False, record)
        if not record.streamed:
            # in the order the program wrote them (EXTENSIONS §16): a notebook's stream
            # outputs alternate as its stdout and stderr did
            for stream, text in result.output_in_order():
                (out.stdout if stream == "stdout" else out.stderr)(text)
        note = truncation_note(result, record.output_limit_bytes)
        if note:
            out.note(note)
        self.shell.user_ns["_kcoral"] = result
        if line_out is not None:
            line_out.metadata = meta
            line_out.show(
                summary_text(result, record, facts),
                status=result.status,
                warning=record.warning,
            )
        if not result.completed:
            hint = missing_input_hint(result, self.shell.user_ns)
            if not hint and record.session_id is None:
                stopped = self.kernel.sessions.stopped_label
                hint = after_stop_hint(result, stopped, "sessions" in facts.features, built.source)
            if not hint and record.session_id is not None:
                hint = ended_with_cell_hint(
                    self.kernel.sessions.active(), record.session_id, record.job_id
                )
            raise RemoteCellError(result, record, hint=hint)
        try:
            outcome = read_outcome(result, built)
        except ProtocolError as exc:  # a server answering what the cell did not ask for
            if line_out is not None:
                line_out.metadata = provenance(result, record, status="ERROR")
                line_out.show(f"refused the server's answer: {exc}", status="ERROR")
            raise
        self.shell.user_ns.update(outcome.outputs)
        for name, item in outcome.files.items():  # also in _kcoral["file:<path>"]
            display(
                {"text/plain": f"{name}: {item!r}", "text/html": rich.value_html(item, name)},
                raw=True,
                metadata={"kcoral": meta},
            )
        if not outcome.has_value:
            return None
        if outcome.display is not None:  # server-authored: text, or HTML in a sandboxed iframe
            display(dict(outcome.display), raw=True, metadata={"kcoral": meta})
            return None
        if outcome.value is not None:
            self._tag_next_result(outcome.value, meta)
        return outcome.value

    def _tag_next_result(self, value: object, meta: dict[str, Any]) -> None:
        """Give the cell's ``execute_result`` our provenance (one shot, this value only)."""
        hook = self.shell.displayhook
        original = type(hook).compute_format_data

        def compute(result: object) -> tuple[dict[str, Any], dict[str, Any]]:
            hook.__dict__.pop("compute_format_data", None)
            data, metadata = original(hook, result)
            if result is value:
                metadata = dict(metadata or {})
                metadata["kcoral"] = meta
            return data, metadata

        hook.compute_format_data = compute  # type: ignore[method-assign]

    def _check_session_cell(self, remote: NotebookSession, url: str | None, gpus: int) -> None:
        """A cell in a session: refused at once when the session ended or when its options
        contradict the session (another server, other GPUs)."""
        if self.kernel.local_gone(remote.url):  # it exited on its own: its sessions with it
            self.kernel.sessions.server_gone(remote.url, LOCAL_SERVER_GONE)
        if remote.ended_message is not None:
            raise ended_error(remote)
        if url and normalize_url(url) != remote.url:
            raise UsageError(
                f"%%kcoral: --url {url}: this kernel's cells run in {remote.label} on "
                f"{remote.url}; %kcoral session stop first to run elsewhere"
            )
        if gpus > 1 and gpus != remote.gpu_count:
            raise UsageError(
                f"%%kcoral: --gpus {gpus}: {remote.label} has {remote.gpu_count or 0} GPUs, "
                "fixed at its start (%kcoral session start --gpus N)"
            )

    @staticmethod
    def _session_refusal(exc: BaseException, remote: NotebookSession | None) -> TwoLineError | None:
        """A refusal of the session's program (ended, busy, unknown), or its server's
        silence, as two lines."""
        if remote is not None and isinstance(exc, TransportError):
            return session_unreachable(exc, remote)
        if remote is None or not isinstance(exc, KCoralError):
            return None
        return session_refusal(exc, remote)

    def _submit(
        self,
        client: Target,
        built: BuiltCell,
        options: ExecuteOptions,
        record: RunRecord,
        args: argparse.Namespace,
        has_jobs: bool,
        line_out: StatusLine,
        remote: NotebookSession | None = None,
    ) -> Job | None:
        if not has_jobs:
            raise UsageError(
                f"%%kcoral --noblock needs the jobs API, which {record.server} does not offer "
                "(run without --noblock)"
            )
        try:  # a large upload and a router's hold said on the line, as a running cell's are
            job = submitted_job(client, built.program, options, line_out, record)
        except KCoralError as exc:
            refusal = self._session_refusal(exc, remote)
            raise (refusal or translate_error(exc, options, record.server)) from None
        self.kernel.pending[job.id] = PendingJob(
            built=built, url=record.server, warning=record.warning, bench_label=args.bench_label
        )
        record.job_id = job.id
        name = args.result_name
        line_out.replaced_by(  # the line that said its upload or wait, where it did
            rich.submitted_job_bundle(job.id, record.server, name),
            {"kcoral": provenance(None, record, status="QUEUED")},
        )
        if name:
            self.shell.user_ns[name] = job
            return None
        return job


def waits_for(select: str | None, facts: ServerFacts) -> str | None:
    """What the cell's status line says it waits for while queued: its selector, else the
    router's default kind (``gpu=h100``), else nothing (a direct server)."""
    if select is not None:
        return select
    return f"gpu={facts.default_kind}" if facts.default_kind else None


def cell_limits(args: argparse.Namespace, settings: KCoral) -> tuple[float | None, int | None]:
    """The cell's timeout and output limit (its options, else the settings), refused in one
    line when no server could take them: a NaN or infinite timeout failed inside the client
    with a traceback through the extension's frames (JSON cannot carry it)."""
    timeout = args.timeout if args.timeout is not None else settings.timeout
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        said = "--timeout" if args.timeout is not None else "KCoral.timeout"
        raise UsageError(f"%%kcoral: {said} must be a number of seconds above 0, not {timeout:g}")
    limit = args.output_limit if args.output_limit is not None else settings.output_limit
    if limit is not None and limit < 0:
        said = "--output-limit" if args.output_limit is not None else "KCoral.output_limit"
        raise UsageError(f"%%kcoral: {said} must be 0 or more bytes, not {limit}")
    return timeout, limit
