"""``%kcoral status``, ``jobs``, ``attach`` and ``cancel``: what a server runs for this kernel.

``attach`` follows a job with the status line a running cell shows and, for a
``--noblock`` job of this kernel, binds its ``--out`` values as the cell would have.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from kcoral import Client, KCoralError, TransportError
from kcoral.jobs import Job, check_job_id
from kcoral_jupyter import display as rich
from kcoral_jupyter.cell_errors import (
    CellCancelledError,
    LocalServerGoneError,
    SessionEndedError,
    answered_by,
    refused,
    unreachable,
)
from kcoral_jupyter.job_clock import JobClock
from kcoral_jupyter.kernel_state import KernelState
from kcoral_jupyter.magics.cell import CellMagic
from kcoral_jupyter.magics.options import MOST_JOBS_LISTED
from kcoral_jupyter.magics.status_line import StatusLine, provenance, summary_text
from kcoral_jupyter.notebook_session import session_ended_under
from kcoral_jupyter.runner import ExecuteOptions, RunRecord, follow_job, translate_error

#: The ``%kcoral jobs`` columns, in words a user reads (``job_row`` fills them).
JOB_COLUMNS = ("job", "status", "worker", "GPUs", "submitted", "took")
#: ``/v1/info`` keys of a router shown as the fleet table instead of rows (``fleet`` has the
#: same rows as ``fleet_status``, which adds the numbers).
FLEET_KEYS = ("fleet", "fleet_status")
#: What to do about a job of a local server that is not running.
AGAIN_OR_ELSEWHERE = (
    "run its cell again (the next %%kcoral cell starts a new local server), or "
    "%kcoral connect URL for a job on another server"
)
#: Said for a value not known (yet): a job still queued has no worker.
UNKNOWN = "\u2014"


class JobCommands:
    """The server's state and its jobs, for the kernel's server or a named one."""

    def __init__(self, kernel: KernelState, cell: CellMagic) -> None:
        self.kernel = kernel
        self.cell = cell  # binds a followed --noblock job's values

    def status(self, args: argparse.Namespace) -> None:
        url = self.kernel.resolve_url(args.url)
        client = self.kernel.client(url)
        health = client.health()
        try:
            info: Mapping[str, Any] = self.kernel.fresh_info(url)
        except KCoralError as exc:
            info = {"error": str(exc)}
        rows: list[tuple[str, Any]] = [("server", url), *self.kernel.settings.describe().items()]
        remote = self.kernel.sessions.active()
        if remote is not None:
            # Asked, as a cell would: a session the server ended (idle too long) is no
            # session cells run in, whatever this kernel last heard.
            if remote.ended_message is None:
                session_ended_under(remote)
            ended = (
                " (ended: %kcoral session start begins a new one)" if remote.ended_message else ""
            )
            rows.append(("session", f"{remote.id} on {remote.url}{ended}"))
        rows += [(f"health.{k}", v) for k, v in health.items()]
        # A router's fleet is a table of its own (ROUTER §6), not two rows of JSON.
        fleet = info.get("fleet_status") or info.get("fleet")
        rows += [(f"info.{k}", v) for k, v in info.items() if k not in FLEET_KEYS]
        display(rich.rows_bundle(rows), raw=True)
        if isinstance(fleet, Mapping):
            table = rich.fleet_rows(fleet)
            text = aligned([list(rich.FLEET_COLUMNS), *table]) if table else "no ready nodes"
            display(rich.table_bundle(rich.FLEET_COLUMNS, table, text), raw=True)

    def jobs(self, args: argparse.Namespace) -> None:
        url = self.kernel.running_url(args.url)
        if url is None:  # not started only to list nothing
            print(f"kcoral: no jobs: {self._no_local_server()}")
            return
        with answered_by(url):
            listed = self.kernel.client(url).jobs(limit=args.limit)
        jobs = [job for job in listed if isinstance(job, dict)]
        columns: tuple[str, ...] = JOB_COLUMNS
        rows = [job_row(job) for job in jobs]
        if len({owner_of(job) for job in jobs}) > 1:
            # An admin lists every identity's jobs (EXTENSIONS §6): say whose each is.
            columns = (*JOB_COLUMNS[:2], "owner", *JOB_COLUMNS[2:])
            rows = [
                [*row[:2], owner_of(job) or UNKNOWN, *row[2:]]
                for row, job in zip(rows, jobs, strict=True)
            ]
        text = aligned([list(columns), *rows]) if rows else "no jobs"
        display(rich.table_bundle(columns, rows, text), raw=True)
        if not listed.whole:  # said, not left out without a word (a router's away nodes)
            more = more_jobs_command(len(listed) + listed.left_out, args.url)
            print(f"kcoral: {left_out_note(listed.left_out, listed.nodes_left_out, more)}")

    def _job_client(self, job_id: str, command: str) -> tuple[Client, str]:
        try:  # as %kcoral session attach does: not a traceback from inside the client
            check_job_id(job_id)
        except (TypeError, ValueError):
            raise UsageError(f"%kcoral {command}: {job_id!r} is not a job id") from None
        pending = self.kernel.pending.get(job_id)
        url = pending.url if pending else self.kernel.running_url()
        if url is None:
            raise LocalServerGoneError(
                f"job {job_id}: {self._no_local_server()}", AGAIN_OR_ELSEWHERE
            )
        if self.kernel.local_gone(url):
            # Not "no answer from URL" and a hint to start a server at that port: a new
            # server there would not have the job either.
            raise LocalServerGoneError(
                f"job {job_id} ran on this kernel's local server at {url}, which has "
                "stopped: its jobs ended with it",
                AGAIN_OR_ELSEWHERE,
            )
        return self.kernel.client(url), url

    def _no_local_server(self) -> str:
        """Why a kernel with no server configured has no jobs before its next cell."""
        if self.kernel.gone_local:
            return "this kernel's local server has stopped, and its jobs ended with it"
        return "no server configured, and this kernel's local server has not started yet"

    def attach(self, args: argparse.Namespace) -> Any:
        job_id: str = args.job_id
        client, url = self._job_client(job_id, "attach")
        job = client.job(job_id)
        pending = self.kernel.pending.get(job_id)
        record = RunRecord(server=url, job_id=job_id, warning=pending.warning if pending else None)
        line_out = StatusLine(
            not self.kernel.settings.quiet, record, local_server=self.kernel.is_local(url)
        )
        # "attaching": nothing is known of the job yet (an unknown id's 404 comes next; a
        # terminal prints every line, so "attached to job ID" stood above the refusal).
        line_out.show(f"attaching to job {job_id}")
        try:
            # its times from its own state: its events replay at once, and the line said
            # "running" without how long it had run
            clock = JobClock.of_job(job_id, job.status())
            result = follow_job(job, line_out, record, clock=clock)
        except KeyboardInterrupt as exc:
            line_out.show(f"stopped following job {job_id}; it keeps running on the server")
            raise CellCancelledError(
                f"stopped following job {job_id}; it keeps running on {url}",
                f"%kcoral attach {job_id} follows it again, %kcoral cancel {job_id} stops it",
            ) from exc
        except KCoralError as exc:
            error = ended_with_session(job, exc, url) or translate_error(exc, ExecuteOptions(), url)
            if error is exc:  # an HTTP error (an unknown id's 404): the line said "attaching"
                said = refused(exc, url)
                line_out.show(said.cause, status="ERROR")
                raise said from None
            line_out.settle()
            raise error from None
        except TransportError as exc:
            # The job's server, named (its event stream's error knows no address), and a
            # status line that no longer says "attached".
            short = unreachable(exc, url)
            line_out.show(short.cause, status="ERROR")
            raise short from exc
        pending = self.kernel.pending.pop(job_id, None)
        facts = self.kernel.facts(url)
        if pending is not None:
            value = self.cell.finish(result, pending.built, record, facts, line_out)
            self.cell.remember_benchmarks(pending.bench_label, value, pending.built.outputs)
            return value
        line_out.metadata = provenance(result, record)
        line_out.show(
            summary_text(result, record, facts),
            status=result.status,
            warning=record.warning,
        )
        return result

    def cancel(self, args: argparse.Namespace) -> None:
        job_id: str = args.job_id
        client, url = self._job_client(job_id, "cancel")
        try:
            client.job(job_id).cancel()
        except KCoralError as exc:  # named by its server, as attach's refusal is
            raise refused(exc, url) from None
        self.kernel.pending.pop(job_id, None)
        print(f"kcoral: cancelled job {job_id} on {url}")


def ended_with_session(job: Job, exc: KCoralError, url: str) -> SessionEndedError | None:
    """A session's job cancelled because its session ended (its ``error_kind`` is
    ``session_ended``, EXTENSIONS §11): said so. Before, "cancelled ... not by this cell: a
    Cancel in the KCoral panel, %kcoral cancel or another client stopped it" after the
    user's own %kcoral session stop had ended it."""
    if exc.kind != "cancelled":
        return None
    try:
        state = job.status()
    except (KCoralError, TransportError):
        return None
    if state.get("error_kind") != "session_ended":
        return None
    worker = state.get("worker_id")
    session = (
        f"session {worker.removeprefix('session/')}"
        if isinstance(worker, str) and worker.startswith("session/")
        else "its session"
    )
    return SessionEndedError(
        f"job {job.id} on {url} was cancelled: {session} ended while it ran",
        "its result is gone: run the cell again (%kcoral session list says why the session "
        "ended; %kcoral session start begins a new one)",
    )


def owner_of(record: Mapping[str, Any]) -> str | None:
    """A job's or session's ``owner`` where it is a name (any other value a server sends,
    a list included, is no owner: a set of them would not even be built)."""
    owner = record.get("owner")
    return owner if isinstance(owner, str) and owner else None


def job_row(job: Mapping[str, Any]) -> list[str]:
    """One ``%kcoral jobs`` row: GPUs as ``0, 1`` or ``cpu`` (ran without one), the time it
    was submitted (UTC, to the second), and how long it took (queue + run: the status line's
    total and the panel's Time, not the run alone), rounded like the status line."""
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
    took, queued = job.get("elapsed_ms"), job.get("queue_ms")
    if isinstance(took, (int, float)) and isinstance(queued, (int, float)):
        took += queued
    status = str(job.get("status") or UNKNOWN)
    if job.get("waiting_for") == "gpus":  # RUNNING, yet another's program has the GPU
        status += " (waiting for GPU)"
    return [
        str(job.get("job_id") or UNKNOWN),
        status,
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


def more_jobs_command(total: int, url: str | None) -> str:
    """The ``%kcoral jobs`` that lists all ``total`` jobs (or as many as a server lists),
    and what it lists."""
    at = f" {url}" if url else ""
    if total > MOST_JOBS_LISTED:
        return f"%kcoral jobs --limit {MOST_JOBS_LISTED}{at} lists the newest {MOST_JOBS_LISTED}"
    return f"%kcoral jobs --limit {total}{at} lists them"


def left_out_note(older: int, nodes: tuple[str, ...], more: str = "") -> str:
    """What a job list says it is missing: older jobs the server cut (and ``more``, the
    command that lists them), and the nodes of a router that were away or did not answer
    (their jobs are not listed)."""
    parts = []
    if older:
        shown = f" ({more})" if more else ""
        parts.append(f"{older} older job{'s' if older != 1 else ''} not listed{shown}")
    if nodes:
        which = ", ".join(nodes)
        parts.append(
            f"not listed: the jobs of node{'s' if len(nodes) != 1 else ''} {which} "
            "(away or not answering)"
        )
    return "; ".join(parts)
