"""``%%kcoral`` (run a cell on a KCoral server) and ``%kcoral`` (jobs, status, connect, local).

The cell path: parse options → build the program (``cell_program``) → run it (``runner``)
with a status line that a display handle updates in place → bind ``--out`` values, show
returned files, return the final expression's value. Every output carries provenance in its
metadata under the key ``kcoral``.

Who can reach what (a malicious server): what a server sends is shown as text or escaped
into our own markup; only the ``--out`` names bind into the namespace (``read_outcome``
refuses the rest), and HTML the server authored appears only in a sandboxed iframe.

``%kcoral session ...`` (EXTENSIONS §11, ``remote_session.py``): while the kernel holds a
session, cells run in its worker's ``kcoral.session.namespace`` (``CellSpec.in_session``).
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import uuid
from collections.abc import Mapping
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import HTML, display

import kcoral
from kcoral import Client, KCoralError, ProgramResult, ProtocolError, TransportError
from kcoral.bench.history import remember_benchmarks
from kcoral_jupyter import display as rich
from kcoral_jupyter.cell_errors import (
    CellCancelledError,
    GpuRequiredError,
    ServerUnreachableError,
    TwoLineError,
    root_reason,
    shorten,
)
from kcoral_jupyter.cell_program import (
    BuiltCell,
    CellSpec,
    build_cell,
    read_outcome,
    split_mapping,
)
from kcoral_jupyter.kernel_client import KernelClient
from kcoral_jupyter.kernel_state import PendingJob, ServerFacts, Session, normalize_url
from kcoral_jupyter.notebook_session import (
    RemoteSession,
    RemoteSessions,
    after_stop_hint,
    creation_refusal,
    ended_error,
    listed_sessions,
    not_found_for_attach,
    require_sessions,
    seconds_text,
    session_interrupted,
    session_refusal,
    status_rows,
)
from kcoral_jupyter.runner import (
    ExecuteOptions,
    RemoteCellError,
    RunRecord,
    Target,
    cancelled,
    follow_job,
    missing_input_hint,
    run_cell,
    translate_error,
)

#: What an explicit ``--gpus`` on a server without GPUs says, in warning style.
CPU_WARNING = "ran on CPU (this server has no GPU)"

HELP = """\
%%kcoral [options]      run the cell on a KCoral server
  -i, --in a,b          send kernel variables (tensors as tensors, bytes as bytes, JSON
                        values as literals, anything else pickled); "-i a, b" works too
  -o, --out c,d         bring remote variables back into the kernel
  --gpus N              GPUs for the cell (default 1; on a CPU server an explicit --gpus
                        runs on CPU and says so in warning style)
  --require-gpu         refuse to run on a server without a GPU (KCoral.require_gpu)
  --numpy, --torch      give every tensor back as NumPy arrays / torch tensors
  --url URL             this cell's server (127.0.0.1:8123 means http://127.0.0.1:8123)
  --timeout S           execution deadline in seconds (KCoral.timeout)
  --output-limit B      bytes of stdout/stderr kept per stream (KCoral.output_limit)
  --file LOCAL[:REMOTE], --folder LOCAL[:REMOTE], --return-file PATH, --return-folder PATH
  --noblock [-r NAME]   submit as a job and return at once (%kcoral attach ID follows it)
  --quiet               no status line
  --bench-label NAME    keep benchmark results in the notebook's history under NAME
  Options are never abbreviated: --gpu is refused, not taken for --gpus.

Types: tensor -i values arrive as torch.Tensor where the server has torch (on the GPU of a GPU
server), else as NumPy arrays. Tensors come back in the library of the cell's -i tensors (NumPy
in, NumPy out; torch in, torch out); with none or both, a remote torch.Tensor comes back as
torch.Tensor when this kernel has torch; --numpy / --torch force either.

%kcoral status [URL]    the server's health, info and these settings
%kcoral jobs [URL]      this server's recent jobs
%kcoral attach ID       follow a job and bind its -o values
%kcoral cancel ID       cancel a job
%kcoral connect URL     run cells on URL (a failed connect leaves the kernel unconnected)
%kcoral local start|stop  the embedded server (Linux only; started by the first cell when
                        no server is configured)
%kcoral local log [LINES] the end of the embedded server's log (default 40 lines), which
                        goes to its log file only, never to the notebook or the terminal
%kcoral url             the URL cells run against
client = %kcoral client a kcoral.Client for the kernel's server, with its token (it follows
                        %kcoral connect and %kcoral local stop/start; the token is never shown)
%kcoral session start [--gpus N] [--idle SECONDS] [--keep]
                        start a session on the kernel's server: from then on %%kcoral cells
                        run in it, so the names a cell defines are there in the next (-i/-o
                        still move values); the kernel's shutdown or restart ends it unless
                        --keep, and the server ends it after --idle SECONDS without a cell
                        (default: its --session-idle-seconds)
%kcoral session stop    end it (its state is gone); cells run without a session again
%kcoral session status  its state, programs, idle deadline and GPU
%kcoral session attach ID  run cells in a session of yours from another kernel (started
                        with --keep); it stays kept when this kernel ends
%kcoral session list    your sessions on the kernel's server
  While a session is active, cells run in it on its server (--url elsewhere is refused), and
  an interrupt raises KeyboardInterrupt in the cell's program: the session stays if it stops
  within 5 s. Names live in kcoral.session.namespace, which the session's client programs see.
%kcoral version         client and server versions
%kcoral --help          this text

Settings: %config KCoral.url / token / timeout / output_limit / quiet / require_gpu /
verbose_errors (True: whole tracebacks instead of two-line errors); KCORAL_URL, KCORAL_TOKEN.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # never sys.exit inside a kernel
        raise UsageError(f"{self.prog}: {message} (%kcoral --help lists the options)")


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if not name.isidentifier():
            raise UsageError(f"%%kcoral: {name!r} is not a Python name")
    return names


#: Options whose value is a comma-separated list of names ("-i a, b" is one value).
_LIST_OPTIONS = frozenset(("-i", "--in", "-o", "--out"))


def join_name_lists(words: list[str]) -> list[str]:
    """Rejoin a name list that the shell split at its spaces: ``-i a, b`` -> ``-i a,b``."""
    joined: list[str] = []
    for word in words:
        if (
            len(joined) >= 2
            and joined[-2] in _LIST_OPTIONS
            and (joined[-1].endswith(",") or word.startswith(","))
        ):
            joined[-1] += word
            continue
        joined.append(word)
    return joined


def cell_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: "--gpu 1" must be refused, not taken for "--gpus 1".
    parser = _Parser(prog="%%kcoral", add_help=False, allow_abbrev=False)
    parser.add_argument("--gpus", type=int, default=None)  # None: not given (runs with 1)
    parser.add_argument("--require-gpu", action="store_true")
    parser.add_argument("--numpy", action="store_true")
    parser.add_argument("--torch", action="store_true")
    parser.add_argument("--url")
    parser.add_argument("-i", "--in", dest="inputs", action="append", default=[])
    parser.add_argument("-o", "--out", dest="outputs", action="append", default=[])
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--output-limit", type=int)
    parser.add_argument("--file", dest="files", action="append", default=[])
    parser.add_argument("--folder", dest="folders", action="append", default=[])
    parser.add_argument("--return-file", dest="return_files", action="append", default=[])
    parser.add_argument("--return-folder", dest="return_folders", action="append", default=[])
    parser.add_argument("--noblock", action="store_true")
    parser.add_argument("-r", dest="result_name")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--bench-label")  # history of benchmark results (EXTENSIONS §12.6)
    return parser


class StatusLine:
    """One line updated in place; its final text is the summary a saved notebook keeps."""

    def __init__(self, enabled: bool, metadata: dict[str, Any]) -> None:
        self.enabled = enabled
        self.metadata = metadata
        self.handle: Any = None
        self.text = ""

    def show(self, text: str, *, status: str | None = None, warning: str | None = None) -> None:
        """Show ``text``; a ``warning`` (said within ``text``) styles it as one (amber, a
        warning sign), and a quiet line still writes the warning to stderr: never hidden."""
        self.text = text
        if not self.enabled:
            if warning:
                sys.stderr.write(f"kcoral: warning: {warning}\n")
            return
        # The status is said once: as the badge in HTML, as the first word in plain text.
        badge = rich.status_badge(status) + " " if status else ""
        word = f"{status} · " if status else ""
        sign = "\u26a0 " if warning else ""
        colour = "#9a6700;font-weight:600" if warning else "#57606a"
        data = {
            "text/plain": f"kcoral: {word}{sign}{text}",
            "text/html": (
                '<div class="kcoral-line" style="font-family:var(--jp-code-font-family,'
                f'monospace);font-size:12px;color:{colour}">{badge}kcoral: {sign}'
                f"{rich.escape(text)}</div>"
            ),
        }
        metadata = {"kcoral": self.metadata}
        if self.handle is None:
            self.handle = display(data, raw=True, metadata=metadata, display_id=True)
        else:
            self.handle.update(data, raw=True, metadata=metadata)

    # Reporter protocol
    def phase(self, text: str) -> None:
        self.show(text)

    def stdout(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def stderr(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()


def provenance(
    result: ProgramResult | None, record: RunRecord, status: str | None = None
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "job_id": record.job_id,
        "server": record.server,
        "worker_id": record.worker_id,
        "gpu_ids": list(record.gpu_ids),
        "target": record.target,
        "status": status,
    }
    if record.warning:
        data["warning"] = record.warning
    if record.session_id:
        data["session_id"] = record.session_id
    if result is not None:
        data.update(
            request_id=result.request_id,
            status=result.status,
            timings={
                "queue_ms": result.queue_ms,
                "lease_wait_ms": result.lease_wait_ms,
                "lease_held_ms": result.lease_held_ms,
                "elapsed_ms": result.elapsed_ms,
                "wall_ms": round(record.wall_ms, 3),
            },
        )
    return data


def summary_text(result: ProgramResult, record: RunRecord, facts: ServerFacts) -> str:
    """The finished cell's line, without its status (``StatusLine.show`` says that once)."""
    on_cpu = facts.gpu_count == 0
    where = "ran on CPU" if on_cpu else f"GPU {list(record.gpu_ids) or facts.label}"
    if record.warning:
        where = record.warning
    pieces = []
    if record.session_id:  # the 8 hex digits %kcoral session status shows in full
        pieces.append(f"session {record.session_id[:8]}")
    pieces.append(record.server)
    if record.worker_id:
        pieces.append(f"worker {record.worker_id}")
    pieces += [where, f"queue {rich.format_ms(result.queue_ms)}"]
    if not on_cpu:  # a CPU server has no GPU lease: its 0.0 ms would say nothing true
        pieces += [
            f"lease wait {rich.format_ms(result.lease_wait_ms)}",
            f"held {rich.format_ms(result.lease_held_ms)}",
        ]
    pieces.append(f"total {rich.format_ms(result.queue_ms + result.elapsed_ms)}")
    if facts.sandbox == "none":  # never a silent downgrade: say when nothing confined it
        pieces.append("no sandbox")
    return " · ".join(pieces)


@magics_class
class KCoralMagics(Magics):
    shell: InteractiveShell  # registered by a shell, never without one

    def __init__(self, shell: InteractiveShell, session: Session) -> None:
        super().__init__(shell)
        self.session = session
        self.remote_sessions = RemoteSessions()  # %kcoral session: where cells keep state

    # ------------------------------------------------------------------------- cell

    @line_cell_magic
    def kcoral(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on a KCoral server; as a line magic: jobs, status, connect, local.
        (Replaced below by ``HELP``, which ``%kcoral --help`` prints too.)"""
        try:
            if cell is None:
                return self._line(line)
            return self._cell(line, cell)
        except (TransportError, KCoralError) as exc:
            # Not a program's failure: the transport's chain of causes and our frames help
            # nobody at the notebook; two lines do (the chain stays on __cause__).
            short = shorten(exc)
            self._mark(short)
            raise short from exc
        except TwoLineError as exc:
            self._mark(exc)
            raise

    def _mark(self, error: Any) -> None:
        if isinstance(error, TwoLineError):
            error.verbose = self.session.settings.verbose_errors

    def _cell(self, line: str, cell: str) -> Any:
        args = cell_parser().parse_args(join_name_lists(shlex.split(line)))
        gpus = args.gpus if args.gpus is not None else 1
        if gpus < 1 or gpus > 8:
            raise UsageError("%%kcoral: --gpus must be from 1 to 8")
        if args.result_name and not args.noblock:
            raise UsageError("%%kcoral: -r NAME goes with --noblock")
        remote = self.remote_sessions.active()
        if remote is not None:
            self._check_session_cell(remote, args.url, gpus)
        settings = self.session.settings
        inputs = {}
        for name in [n for text in args.inputs for n in _names(text)]:
            if name not in self.shell.user_ns:
                raise UsageError(f"%%kcoral: --in {name}: no such name in the kernel")
            inputs[name] = self.shell.user_ns[name]
        try:
            spec = CellSpec(
                source=cell,
                inputs=inputs,
                outputs=[n for text in args.outputs for n in _names(text)],
                files=[split_mapping(text) for text in args.files],
                folders=[split_mapping(text) for text in args.folders],
                return_files=list(args.return_files),
                return_folders=list(args.return_folders),
                numpy=args.numpy,
                torch=args.torch,
                in_session=remote is not None,
            )
            built = build_cell(spec)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"%%kcoral: {exc}") from None

        url = remote.url if remote is not None else self.session.resolve_url(args.url)
        facts = self.session.facts(url)
        if facts.gpu_count == 0 and (args.require_gpu or settings.require_gpu):
            said = "--require-gpu" if args.require_gpu else "KCoral.require_gpu"
            raise GpuRequiredError(
                f"{url} has no GPU and {said} asks for one: the cell did not run",
                "connect to a GPU server (%kcoral connect URL), or drop --require-gpu / "
                "%config KCoral.require_gpu = False to run on CPU",
            )
        if gpus > 1 and facts.gpu_count < gpus and remote is None:
            raise UsageError(
                f"%%kcoral: --gpus {gpus} needs a server with at least {gpus} GPUs; "
                f"{url} has {facts.gpu_count} ({facts.label})"
            )
        options = ExecuteOptions(
            timeout_seconds=args.timeout if args.timeout is not None else settings.timeout,
            output_limit_bytes=(
                args.output_limit if args.output_limit is not None else settings.output_limit
            ),
            # A session's GPUs were chosen at its start: its programs name none.
            gpu_count=gpus if gpus > 1 and remote is None else None,
            serialization=built.serialization,
        )
        client: Target = self.session.client(url) if remote is None else remote.handle
        has_jobs = "jobs" in facts.features
        record = RunRecord(
            server=url,
            target=facts.target,
            device=facts.device,
            # Who asked for a GPU must never take CPU timings for GPU ones (the default
            # --gpus 1 of every cell says nothing: only an explicit one warns).
            warning=CPU_WARNING if args.gpus is not None and facts.gpu_count == 0 else None,
            output_limit_bytes=options.output_limit_bytes,
            session_id=remote.id if remote is not None else None,
        )
        line_out = StatusLine(not (args.quiet or settings.quiet), provenance(None, record))

        if args.noblock:
            return self._submit(client, built, options, record, args.result_name, has_jobs, remote)
        use_jobs = settings.use_jobs and has_jobs

        try:
            result = run_cell(client, built, options, line_out, record=record, use_jobs=use_jobs)
        except KeyboardInterrupt as exc:
            if isinstance(exc, TwoLineError):  # cancelled elsewhere (the panel's Cancel)
                line_out.show(exc.cause, status="CANCELLED")
                raise
            if remote is not None:
                line_out.show(f"interrupted: KeyboardInterrupt raised in {remote.label}")
                raise session_interrupted(remote) from exc
            line_out.show("interrupted; the remote work was cancelled (kernel state kept)")
            raise cancelled(f"interrupted: the cell's remote work on {url} was cancelled") from exc
        except Exception as exc:
            line_out.metadata = provenance(None, record, status="ERROR")
            refusal = self._session_refusal(exc, remote)
            if refusal is not None:
                line_out.show(refusal.cause, status="ERROR")
                raise refusal from exc
            short = shorten(exc, url)
            line_out.show(
                short.cause if isinstance(short, TwoLineError) else f"{type(exc).__name__}: {exc}",
                status="ERROR",
            )
            if short is exc:
                raise
            raise short from exc
        value = self._finish(result, built, record, facts, line_out)
        bound = [value, *(self.shell.user_ns.get(name) for name in spec.outputs)]
        for note in remember_benchmarks(args.bench_label, bound, self.shell.user_ns):
            print(note)
        return value

    def _finish(
        self,
        result: ProgramResult,
        built: Any,
        record: RunRecord,
        facts: ServerFacts,
        line_out: StatusLine | None,
    ) -> Any:
        meta = provenance(result, record)
        if not record.streamed:
            if result.stdout:
                sys.stdout.write(result.stdout)
                sys.stdout.flush()
            if result.stderr:
                sys.stderr.write(result.stderr)
                sys.stderr.flush()
        for stream, truncated in (
            ("stdout", result.stdout_truncated),
            ("stderr", result.stderr_truncated),
        ):
            if truncated:
                sys.stderr.write(truncation_note(stream, record.output_limit_bytes))
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
                hint = after_stop_hint(result, self.remote_sessions.stopped_label)
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

    def _tag_next_result(self, value: Any, meta: dict[str, Any]) -> None:
        """Give the cell's ``execute_result`` our provenance (one shot, this value only)."""
        hook = self.shell.displayhook
        original = type(hook).compute_format_data

        def compute(result: Any) -> Any:
            hook.__dict__.pop("compute_format_data", None)
            data, metadata = original(hook, result)
            if result is value:
                metadata = dict(metadata or {})
                metadata["kcoral"] = meta
            return data, metadata

        # one shot: this instance's override, which removes itself on first use
        hook.compute_format_data = compute  # type: ignore[method-assign]

    def _check_session_cell(self, remote: RemoteSession, url: str | None, gpus: int) -> None:
        """A cell in a session: refused at once when the session ended or when its options
        contradict the session (another server, other GPUs)."""
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
    def _session_refusal(exc: BaseException, remote: RemoteSession | None) -> Any:
        """A refusal of the session's program (ended, busy, unknown) as two lines."""
        if remote is None or not isinstance(exc, KCoralError):
            return None
        return session_refusal(exc, remote)

    def _submit(
        self,
        client: Target,
        built: BuiltCell,
        options: ExecuteOptions,
        record: RunRecord,
        name: str | None,
        has_jobs: bool,
        remote: RemoteSession | None = None,
    ) -> Any:
        if not has_jobs:
            raise UsageError(
                f"%%kcoral --noblock needs the jobs API, which {record.server} does not offer "
                "(run without --noblock)"
            )
        try:
            job = client.submit(built.program, **options.as_kwargs())
        except KCoralError as exc:
            refusal = self._session_refusal(exc, remote)
            raise (refusal or translate_error(exc, options, record.server)) from None
        self.session.pending[job.id] = PendingJob(
            built=built, url=record.server, warning=record.warning
        )
        record.job_id = job.id
        display(
            HTML(
                f"<div style='font-family:monospace;font-size:12px'>kcoral: submitted job "
                f"<code>{rich.escape(job.id)}</code> to {rich.escape(record.server)}"
                f"{' as ' + rich.escape(name) if name else ''}; "
                f"<code>%kcoral attach {rich.escape(job.id)}</code> follows it</div>"
            ),
            metadata={"kcoral": provenance(None, record, status="QUEUED")},
        )
        if name:
            self.shell.user_ns[name] = job
            return None
        return job

    # ------------------------------------------------------------------------- line

    def _line(self, line: str) -> Any:
        words = shlex.split(line)
        if not words:
            raise UsageError(
                "%kcoral: use %%kcoral as a cell magic, or %kcoral status | jobs | attach ID | "
                "cancel ID | connect URL | local start|stop|log | session ... | url | client | "
                "version (%kcoral --help)"
            )
        command, rest = words[0], words[1:]
        handler = {
            "--help": self._help,
            "-h": self._help,
            "help": self._help,
            "version": self._version,
            "--version": self._version,
            "status": self._status,
            "jobs": self._jobs,
            "attach": self._attach,
            "cancel": self._cancel,
            "connect": self._connect,
            "local": self._local,
            "url": self._url,
            "client": self._kernel_client,
            "session": self._remote_session,
        }.get(command)
        if handler is None:
            raise UsageError(f"%kcoral: unknown command {command!r} (%kcoral --help lists them)")
        return handler(rest)

    def _help(self, rest: list[str]) -> None:
        print(HELP, end="")

    def _version(self, rest: list[str]) -> None:
        """The client's version, and the server's when one is chosen (never starts one)."""
        if rest:
            raise UsageError("%kcoral version")
        print(f"kcoral {kcoral.__version__} (client; Python {platform.python_version()})")
        session = self.session
        url = session.settings.url or (session.local.url if session.local else None)
        if not url:
            print("server: none yet (the first cell starts the embedded one)")
            return
        url = normalize_url(url)
        try:
            info = session.client(url).info()
            print(f"server {url}: kcoral {info.get('kcoral')} (protocol {info.get('protocol')})")
        except TransportError as exc:
            print(f"server {url}: no answer ({root_reason(exc)})")
        except KCoralError as exc:  # a server of the published protocol has no /v1/info
            print(f"server {url}: version unknown (HTTP {exc.status_code})")

    def _status(self, rest: list[str]) -> None:
        url = self.session.resolve_url(rest[0] if rest else None)
        client = self.session.client(url)
        health = client.health()
        try:
            info: Mapping[str, Any] = client.info()
        except KCoralError as exc:
            info = {"error": str(exc)}
        rows = [("server", url), *self.session.settings.describe().items()]
        remote = self.remote_sessions.active()
        if remote is not None:
            rows.append(("session", f"{remote.id} on {remote.url}"))
        rows += [(f"health.{k}", v) for k, v in health.items()]
        rows += [(f"info.{k}", v) for k, v in info.items()]
        table = "".join(
            f"<tr><td style='padding:1px 8px'><b>{rich.escape(k)}</b></td>"
            f"<td style='padding:1px 8px;text-align:left'>{rich.escape(v)}</td></tr>"
            for k, v in rows
        )
        text = "\n".join(f"{k}: {v}" for k, v in rows)
        display(
            {
                "text/plain": text,
                "text/html": f"<table class='kcoral-status-table'>{table}</table>",
            },
            raw=True,
        )

    def _jobs(self, rest: list[str]) -> None:
        url = self.session.resolve_url(rest[0] if rest else None)
        jobs = [job for job in self.session.client(url).jobs() if isinstance(job, dict)]
        head = "".join(f"<th>{rich.escape(title)}</th>" for title in JOB_COLUMNS)
        rows = [job_row(job) for job in jobs]
        body = "".join(
            "<tr>" + "".join(f"<td>{rich.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in rows
        )
        text = aligned([list(JOB_COLUMNS), *rows]) if rows else "no jobs"
        display(
            {"text/plain": text, "text/html": f"<table><tr>{head}</tr>{body}</table>"}, raw=True
        )

    def _job_client(self, job_id: str) -> tuple[Client, str]:
        pending = self.session.pending.get(job_id)
        url = pending.url if pending else self.session.resolve_url()
        return self.session.client(url), url

    def _attach(self, rest: list[str]) -> Any:
        if len(rest) != 1:
            raise UsageError("%kcoral attach JOB_ID")
        job_id = rest[0]
        client, url = self._job_client(job_id)
        job = client.job(job_id)
        pending = self.session.pending.get(job_id)
        record = RunRecord(server=url, job_id=job_id, warning=pending.warning if pending else None)
        line_out = StatusLine(not self.session.settings.quiet, provenance(None, record))
        line_out.show(f"attached to job {job_id}")
        try:
            result = follow_job(job, line_out, record)
        except KeyboardInterrupt as exc:
            line_out.show(f"stopped following job {job_id}; it keeps running on the server")
            raise CellCancelledError(
                f"stopped following job {job_id}; it keeps running on {url}",
                f"%kcoral attach {job_id} follows it again, %kcoral cancel {job_id} stops it",
            ) from exc
        except KCoralError as exc:
            raise translate_error(exc, ExecuteOptions(), url) from None
        pending = self.session.pending.pop(job_id, None)
        facts = self.session.facts(url)
        if pending is not None:
            return self._finish(result, pending.built, record, facts, line_out)
        line_out.metadata = provenance(result, record)
        line_out.show(
            summary_text(result, record, facts),
            status=result.status,
            warning=record.warning,
        )
        return result

    def _cancel(self, rest: list[str]) -> None:
        if len(rest) != 1:
            raise UsageError("%kcoral cancel JOB_ID")
        client, url = self._job_client(rest[0])
        client.job(rest[0]).cancel()
        self.session.pending.pop(rest[0], None)
        print(f"kcoral: cancelled job {rest[0]} on {url}")

    def _connect(self, rest: list[str]) -> None:
        if len(rest) != 1:
            raise UsageError("%kcoral connect URL")
        url = normalize_url(rest[0])
        try:
            facts = self.session.facts(url)
        except (TransportError, KCoralError) as exc:
            # Never fall back silently: the next cell says it is not connected.
            reason = root_reason(exc) if isinstance(exc, TransportError) else str(exc)
            self.session.connect_failed(url, reason)
            raise ServerUnreachableError(
                f"could not connect to {url}: {reason}",
                "the kernel stays unconnected (cells refuse to run) until a %kcoral connect "
                "succeeds; check the URL and that the server runs there",
            ) from exc
        self.session.settings.url = url
        self.session.clear_failed_connect()  # also when the URL was already the setting
        self.session.use(url)  # the JupyterLab status bar follows this kernel's connection
        sandbox = f", sandbox: {facts.sandbox}" if facts.sandbox else ""
        features = ", ".join(facts.features)
        print(f"kcoral: connected to {url} ({facts.label}{sandbox}, features: {features})")
        remote = self.remote_sessions.active()
        if remote is not None and remote.url != url:
            print(
                f"kcoral: cells still run in {remote.label} on {remote.url} until "
                "%kcoral session stop"
            )

    def _url(self, rest: list[str]) -> str:
        """The URL cells run against (starts the local server if that is the default)."""
        if rest:
            raise UsageError("%kcoral url")
        return self.session.resolve_url()

    def _kernel_client(self, rest: list[str]) -> KernelClient:
        """``client = %kcoral client``: a Client that follows this kernel's connection (its
        URL and token are looked up on every request, so a restarted embedded server's new
        token is used; the object never holds or shows the token)."""
        if rest:
            raise UsageError("%kcoral client")
        return KernelClient(self.session)

    def _local(self, rest: list[str]) -> None:
        if rest == ["start"]:
            url = self.session.start_local()
            print(f"kcoral: local server running at {url}")
        elif rest == ["stop"]:
            stopped = self.session.stop_local()
            print("kcoral: local server stopped" if stopped else "kcoral: no local server")
        elif rest[:1] == ["log"] and len(rest) <= 2:
            self._local_log(rest[1:])
        else:
            raise UsageError("%kcoral local start|stop|log [LINES]")

    def _local_log(self, rest: list[str]) -> None:
        """The end of the embedded server's log: it never goes to the notebook or the
        terminal on its own (issue 29.8), so this is the switch that shows it."""
        try:
            lines = int(rest[0]) if rest else 40
        except ValueError:
            lines = 0
        if lines < 1:
            raise UsageError("%kcoral local log [LINES]: LINES is a positive whole number")
        local = self.session.local
        path = local.log_path if local is not None else None
        if local is None or path is None:
            print("kcoral: no local server (the first cell without a configured server starts one)")
            return
        print(f"kcoral: the last {lines} lines of {path}")
        print(local.log_tail(lines), end="")

    # --------------------------------------------------------------- session (EXTENSIONS §11)

    def _remote_session(self, rest: list[str]) -> Any:
        command = rest[0] if rest else ""
        handler = {
            "start": self._session_start,
            "stop": self._session_stop,
            "status": self._session_status,
            "attach": self._session_attach,
            "list": self._session_list,
        }.get(command)
        if handler is None:
            raise UsageError(SESSION_USAGE)
        return handler(rest[1:])

    def _session_server(self, what: str) -> tuple[str, Client]:
        """The kernel's server for a new or attached session, which must offer sessions;
        refused while the kernel is in a session that has not ended."""
        remote = self.remote_sessions.active()
        if remote is not None and remote.ended_message is None:
            raise UsageError(
                f"%kcoral session {what}: this kernel's cells run in {remote.label} on "
                f"{remote.url}; %kcoral session stop ends it first"
            )
        url = self.session.resolve_url()
        require_sessions(url, self.session.facts(url).features)
        return url, self.session.client(url)

    def _session_start(self, rest: list[str]) -> None:
        args = session_start_parser().parse_args(rest)
        if args.gpus is not None and args.gpus < 1:  # checked here too: a CPU server drops it
            raise UsageError("%kcoral session start: --gpus must be 1 or more")
        url, client = self._session_server("start")
        facts = self.session.facts(url)
        gpu_count = args.gpus
        if gpu_count is not None and facts.gpu_count == 0:
            print(f"kcoral: warning: {url} has no GPU: the session runs on CPU", file=sys.stderr)
            gpu_count = None  # a CPU server takes no gpu_count (EXTENSIONS §11)
        try:
            handle = client.session(gpu_count=gpu_count, idle_timeout=args.idle)
        except ValueError as exc:
            raise UsageError(f"%kcoral session start: {exc}") from None
        except KCoralError as exc:
            refusal = creation_refusal(exc, url)
            if refusal is None:
                raise
            raise refusal from exc
        remote = self.remote_sessions.adopt(
            RemoteSession(handle, url, self.session.token_for(url), keep=args.keep)
        )
        ends = (
            "kept when this kernel ends: %kcoral session attach " + remote.id + " picks it up"
            if args.keep
            else "ended when this kernel shuts down or restarts"
        )
        print(
            f"kcoral: {remote.label} started on {url} ({session_place(handle.record)}, idle "
            f"timeout {seconds_text(handle.record.get('idle_timeout_seconds'))}); %%kcoral cells "
            "run in it; "
            f"{ends}\nkcoral: session id {remote.id}"
        )

    def _session_stop(self, rest: list[str]) -> None:
        if rest:
            raise UsageError("%kcoral session stop")
        remote = self.remote_sessions.stop()
        if remote is None:
            print("kcoral: no session in this kernel (cells run without one)")
            return
        print(
            f"kcoral: {remote.label} ended on {remote.url} (its state is gone); cells run "
            "without a session again"
        )

    def _session_status(self, rest: list[str]) -> None:
        if rest:
            raise UsageError("%kcoral session status")
        remote = self.remote_sessions.active()
        if remote is None:
            print("kcoral: no session in this kernel (%kcoral session start begins one)")
            return
        try:
            record = remote.handle.info()
        except KCoralError as exc:
            refusal = session_refusal(exc, remote)
            if refusal is None:
                raise
            raise refusal from exc
        if record.get("state") == "ENDED":
            remote.ended_message = str(record.get("end_message") or "ended")
        self._show_rows(status_rows(record, remote))

    def _session_attach(self, rest: list[str]) -> None:
        if len(rest) != 1:
            raise UsageError("%kcoral session attach SESSION_ID")
        session_id = rest[0]
        if not is_session_id(session_id):
            raise UsageError(f"%kcoral session attach: {session_id!r} is not a session id")
        url, client = self._session_server("attach")
        try:
            handle = client.attach_session(session_id)
        except KCoralError as exc:
            if exc.status_code == 404:
                raise not_found_for_attach(session_id, url) from exc
            raise
        remote = RemoteSession(handle, url, self.session.token_for(url), keep=True)
        if handle.record.get("state") == "ENDED":
            remote.ended_message = str(handle.record.get("end_message") or "ended")
            raise ended_error(remote)
        self.remote_sessions.adopt(remote)
        print(
            f"kcoral: attached to {remote.label} on {url} ({session_place(handle.record)}, "
            f"{handle.record.get('programs')} programs so far); %%kcoral cells run in it; "
            "it is kept when this kernel ends (%kcoral session stop ends it)"
        )

    def _session_list(self, rest: list[str]) -> None:
        if rest:
            raise UsageError("%kcoral session list")
        url = self.session.resolve_url()
        require_sessions(url, self.session.facts(url).features)
        records = listed_sessions(self.session.client(url))
        if not records:
            print(f"kcoral: no sessions of yours on {url}")
            return
        for record in records:
            print(
                f"{record.get('session_id')}  {record.get('state')}  "
                f"{record.get('programs')} programs  {session_place(record)}"
            )

    def _show_rows(self, rows: list[tuple[str, str]]) -> None:
        table = "".join(
            f"<tr><td style='padding:1px 8px'><b>{rich.escape(k)}</b></td>"
            f"<td style='padding:1px 8px;text-align:left'>{rich.escape(v)}</td></tr>"
            for k, v in rows
        )
        display(
            {
                "text/plain": "\n".join(f"{k}: {v}" for k, v in rows),
                "text/html": f"<table class='kcoral-status-table'>{table}</table>",
            },
            raw=True,
        )


KCoralMagics.kcoral.__doc__ = HELP  # %kcoral? shows the same text as %kcoral --help


SESSION_USAGE = (
    "%kcoral session start [--gpus N] [--idle SECONDS] [--keep] | stop | status | "
    "attach SESSION_ID | list (%kcoral --help)"
)


def session_start_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%kcoral session start", add_help=False, allow_abbrev=False)
    parser.add_argument("--gpus", type=int, default=None)  # None: the server's default
    parser.add_argument("--idle", type=float, default=None)  # None: --session-idle-seconds
    parser.add_argument("--keep", action="store_true")
    return parser


def is_session_id(text: str) -> bool:
    """A UUID's shape (what the server makes, EXTENSIONS §11), checked before it goes into
    a request path."""
    try:
        return str(uuid.UUID(text)) == text.lower() and len(text) == 36
    except ValueError:
        return False


def session_place(record: Mapping[str, Any]) -> str:
    """Where a session's programs run, from its record: ``GPU [0]`` or ``CPU``."""
    gpu_ids = record.get("gpu_ids")
    return f"GPU {gpu_ids}" if gpu_ids else "CPU"


#: The ``%kcoral jobs`` columns, in words a user reads (``job_row`` fills them).
JOB_COLUMNS = ("job", "status", "worker", "GPUs", "submitted", "took")
#: Said for a value not known (yet): a job still queued has no worker.
UNKNOWN = "\u2014"


def job_row(job: Mapping[str, Any]) -> list[str]:
    """One ``%kcoral jobs`` row: GPUs as ``0, 1`` or ``cpu`` (ran without one), the time it
    was submitted (UTC, to the second), and how long it ran, rounded like the status line."""
    gpu_ids = job.get("gpu_ids")
    if isinstance(gpu_ids, list) and gpu_ids:
        gpus = ", ".join(str(i) for i in gpu_ids)
    elif isinstance(gpu_ids, list):
        gpus = "cpu"
    else:
        gpus = UNKNOWN
    submitted = job.get("submitted_at")
    if isinstance(submitted, str) and "T" in submitted:
        day, clock = submitted.split("T", 1)
        submitted = f"{day} {clock[:8]} UTC"
    took = job.get("elapsed_ms")
    return [
        str(job.get("job_id") or UNKNOWN),
        str(job.get("status") or UNKNOWN),
        str(job.get("worker_id") or UNKNOWN),
        gpus,
        str(submitted or UNKNOWN),
        rich.format_ms(took) if isinstance(took, (int, float)) else UNKNOWN,
    ]


def aligned(rows: list[list[str]]) -> str:
    """Rows as plain-text columns, each padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def truncation_note(stream: str, limit: int | None) -> str:
    """What a truncated stream says: the limit that cut it and how to move it."""
    said = f"{limit} bytes" if limit is not None else "the server's default"
    return (
        f"[kcoral: {stream} was truncated at the output limit ({said} per stream); raise it "
        "with --output-limit BYTES or %config KCoral.output_limit = BYTES (the server caps "
        "it at its max_output_limit_bytes, see %kcoral status)]\n"
    )
