"""``%%kcoral`` (run a cell on a KCoral server) and ``%kcoral`` (jobs, status, connect, local).

The cell path: parse options → build the program (``cell_program``) → run it (``runner``)
with a status line that a display handle updates in place → bind ``--out`` values, show
returned files, return the final expression's value. Every output carries provenance in its
metadata under the key ``kcoral``.

Who can reach what (a malicious server): what a server sends is shown as text or escaped
into our own markup; only the ``--out`` names bind into the namespace (``read_outcome``
refuses the rest), and HTML the server authored appears only in a sandboxed iframe.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import HTML, display
from kcoral_jupyter import display as rich
from kcoral_jupyter.cell_program import (
    BuiltCell,
    CellSpec,
    build_cell,
    read_outcome,
    split_mapping,
)
from kcoral_jupyter.runner import (
    ExecuteOptions,
    RemoteCellError,
    RunRecord,
    follow_job,
    run_cell,
    translate_error,
)
from kcoral_jupyter.session import PendingJob, ServerFacts, Session

from kcoral import Client, KCoralError, ProgramResult, ProtocolError, TransportError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # never sys.exit inside a kernel
        raise UsageError(f"%%kcoral: {message}\n{self.format_usage()}")


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if not name.isidentifier():
            raise UsageError(f"%%kcoral: {name!r} is not a Python name")
    return names


def cell_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%%kcoral", add_help=False)
    parser.add_argument("--gpus", type=int, default=1)
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
    return parser


class StatusLine:
    """One line updated in place; its final text is the summary a saved notebook keeps."""

    def __init__(self, enabled: bool, metadata: dict[str, Any]) -> None:
        self.enabled = enabled
        self.metadata = metadata
        self.handle: Any = None
        self.text = ""

    def show(self, text: str, *, status: str | None = None) -> None:
        self.text = text
        if not self.enabled:
            return
        badge = rich.status_badge(status) + " " if status else ""
        data = {
            "text/plain": f"kcoral: {text}",
            "text/html": (
                '<div class="kcoral-line" style="font-family:var(--jp-code-font-family,'
                f'monospace);font-size:12px;color:#57606a">{badge}kcoral: {rich.escape(text)}'
                "</div>"
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
    label = facts.label
    where = "ran on CPU" if label == "CPU" else f"GPU {list(record.gpu_ids) or label}"
    pieces = [result.status, record.server]
    if record.worker_id:
        pieces.append(f"worker {record.worker_id}")
    pieces += [
        where,
        f"queue {rich.format_ms(result.queue_ms)}",
        f"lease wait {rich.format_ms(result.lease_wait_ms)}",
        f"held {rich.format_ms(result.lease_held_ms)}",
        f"total {rich.format_ms(result.queue_ms + result.elapsed_ms)}",
    ]
    if facts.sandbox == "none":  # never a silent downgrade: say when nothing confined it
        pieces.append("no sandbox")
    return " · ".join(pieces)


@magics_class
class KCoralMagics(Magics):
    def __init__(self, shell: Any, session: Session) -> None:
        super().__init__(shell)
        self.session = session

    # ------------------------------------------------------------------------- cell

    @line_cell_magic
    def kcoral(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on a KCoral server; as a line magic: jobs, status, connect, local.

        %%kcoral [--gpus N] [--url URL] [-i a,b] [-o c,d] [--timeout S] [--output-limit B]
                 [--file LOCAL[:REMOTE]]… [--folder LOCAL[:REMOTE]]… [--return-file PATH]…
                 [--return-folder PATH]… [--noblock [-r NAME]] [--quiet]
        %kcoral status | jobs | attach ID | cancel ID | connect URL | local start|stop | url
        """
        if cell is None:
            return self._line(line)
        return self._cell(line, cell)

    def _cell(self, line: str, cell: str) -> Any:
        args = cell_parser().parse_args(shlex.split(line))
        if args.gpus < 1 or args.gpus > 8:
            raise UsageError("%%kcoral: --gpus must be from 1 to 8")
        if args.result_name and not args.noblock:
            raise UsageError("%%kcoral: -r NAME goes with --noblock")
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
            )
            built = build_cell(spec)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"%%kcoral: {exc}") from None

        url = self.session.resolve_url(args.url)
        facts = self.session.facts(url)
        if args.gpus > 1 and facts.gpu_count < args.gpus:
            raise UsageError(
                f"%%kcoral: --gpus {args.gpus} needs a server with at least {args.gpus} GPUs; "
                f"{url} has {facts.gpu_count} ({facts.label})"
            )
        options = ExecuteOptions(
            timeout_seconds=args.timeout if args.timeout is not None else settings.timeout,
            output_limit_bytes=(
                args.output_limit if args.output_limit is not None else settings.output_limit
            ),
            gpu_count=args.gpus if args.gpus > 1 else None,
            serialization=built.serialization,
        )
        client = self.session.client(url)
        has_jobs = "jobs" in facts.features
        record = RunRecord(server=url, target=facts.target, device=facts.device)
        line_out = StatusLine(not (args.quiet or settings.quiet), provenance(None, record))

        if args.noblock:
            return self._submit(client, built, options, record, args.result_name, has_jobs)
        use_jobs = settings.use_jobs and has_jobs

        try:
            result = run_cell(client, built, options, line_out, record=record, use_jobs=use_jobs)
        except KeyboardInterrupt:
            line_out.show("interrupted; the remote work was cancelled (kernel state kept)")
            raise
        except TransportError as exc:
            line_out.show(f"no answer from {url}: {exc}", status="ERROR")
            raise
        except Exception as exc:
            line_out.metadata = provenance(None, record, status="ERROR")
            line_out.show(f"{type(exc).__name__}: {exc}", status="ERROR")
            raise
        return self._finish(result, built, record, facts, line_out)

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
                sys.stderr.write(f"[kcoral: {stream} was truncated by the output limit]\n")
        self.shell.user_ns["_kcoral"] = result
        if line_out is not None:
            line_out.metadata = meta
            line_out.show(summary_text(result, record, facts), status=result.status)
        if not result.completed:
            raise RemoteCellError(result, record)
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

        hook.compute_format_data = compute

    def _submit(
        self,
        client: Client,
        built: BuiltCell,
        options: ExecuteOptions,
        record: RunRecord,
        name: str | None,
        has_jobs: bool,
    ) -> Any:
        if not has_jobs:
            raise UsageError(
                f"%%kcoral --noblock needs the jobs API, which {record.server} does not offer "
                "(run without --noblock)"
            )
        try:
            job = client.submit(built.program, **options.as_kwargs())
        except KCoralError as exc:
            raise translate_error(exc, options, record.server) from None
        self.session.pending[job.id] = PendingJob(built=built, url=record.server)
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
                "cancel ID | connect URL | local start|stop"
            )
        command, rest = words[0], words[1:]
        handler = {
            "status": self._status,
            "jobs": self._jobs,
            "attach": self._attach,
            "cancel": self._cancel,
            "connect": self._connect,
            "local": self._local,
            "url": self._url,
        }.get(command)
        if handler is None:
            raise UsageError(f"%kcoral: unknown command {command!r}")
        return handler(rest)

    def _status(self, rest: list[str]) -> None:
        url = self.session.resolve_url(rest[0] if rest else None)
        client = self.session.client(url)
        health = client.health()
        try:
            info: Mapping[str, Any] = client.info()
        except KCoralError as exc:
            info = {"error": str(exc)}
        rows = [("server", url), *self.session.settings.describe().items()]
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
        jobs = self.session.client(url).jobs()
        keys = ("job_id", "status", "worker_id", "gpu_ids", "queue_ms", "elapsed_ms")
        head = "".join(f"<th>{k}</th>" for k in keys)
        body = "".join(
            "<tr>" + "".join(f"<td>{rich.escape(job.get(k))}</td>" for k in keys) + "</tr>"
            for job in jobs
            if isinstance(job, dict)
        )
        text = "\n".join(" ".join(str(job.get(k)) for k in keys) for job in jobs) or "no jobs"
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
        record = RunRecord(server=url, job_id=job_id)
        line_out = StatusLine(not self.session.settings.quiet, provenance(None, record))
        line_out.show(f"attached to job {job_id}")
        try:
            result = follow_job(job, line_out, record)
        except KeyboardInterrupt:
            line_out.show(f"stopped following job {job_id}; it keeps running on the server")
            raise
        except KCoralError as exc:
            raise translate_error(exc, ExecuteOptions(), url) from None
        pending = self.session.pending.pop(job_id, None)
        facts = self.session.facts(url)
        if pending is not None:
            return self._finish(result, pending.built, record, facts, line_out)
        line_out.metadata = provenance(result, record)
        line_out.show(summary_text(result, record, facts), status=result.status)
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
        url = rest[0].rstrip("/")
        facts = self.session.facts(url)  # fails loudly when the server is unreachable
        self.session.settings.url = url
        self.session.use(url)  # the JupyterLab status bar follows this kernel's connection
        sandbox = f", sandbox: {facts.sandbox}" if facts.sandbox else ""
        features = ", ".join(facts.features)
        print(f"kcoral: connected to {url} ({facts.label}{sandbox}, features: {features})")

    def _url(self, rest: list[str]) -> str:
        """The URL cells run against (starts the local server if that is the default)."""
        if rest:
            raise UsageError("%kcoral url")
        return self.session.resolve_url()

    def _local(self, rest: list[str]) -> None:
        if rest == ["start"]:
            url = self.session.start_local()
            print(f"kcoral: local server running at {url}")
        elif rest == ["stop"]:
            stopped = self.session.stop_local()
            print("kcoral: local server stopped" if stopped else "kcoral: no local server")
        else:
            raise UsageError("%kcoral local start|stop")
