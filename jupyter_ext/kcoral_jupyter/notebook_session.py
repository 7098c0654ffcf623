"""The kernel's session on a KCoral server (EXTENSIONS §11): ``%kcoral session start`` pins a
worker, and every ``%%kcoral`` cell then runs in its ``kcoral.session.namespace``, so the
names one cell defines are there in the next.

``NotebookSession`` is that session as the notebook holds it (the client's ``Session`` handle,
its server, whether it is kept); ``SessionHolder`` (``KernelState.sessions``) holds the one
the cells run in. Only the public client API is used (``Client.sessions``,
``Session.info``/``close``). No IPython import.

Lifetime: a session this kernel started ends when the kernel process exits (a shutdown or a
restart both end the process; ``atexit`` sends the ``DELETE``) unless it was started with
``--keep``. A kernel killed without running its exit hooks leaves the session to the server's
idle timeout. A session picked up with ``attach`` was kept on purpose, so it stays kept.

Who can reach what: a session answers only the identity (token) that created it; another
token gets ``404`` exactly as for an unknown id (the server enforces it, EXTENSIONS §11), so
an id shown in a notebook gives nobody else its state. A malicious server's records are only
shown as text (``status_rows`` stringifies every field it reads).
"""

from __future__ import annotations

import ast
import atexit
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kcoral import Client, KCoralError, ProgramResult, ProtocolError, TransportError
from kcoral.client_sessions import Session as ClientSession
from kcoral.errors import answered_but_line, root_reason
from kcoral.protocol.strict_json import finite_float
from kcoral_jupyter.cell_errors import (
    CellCancelledError,
    ServerUnreachableError,
    SessionBusyError,
    SessionEndedError,
    SessionNotFoundError,
    SessionOptionsRefusedError,
    SessionSeatsFullError,
    SessionsUnavailableError,
    TwoLineError,
    refused,
)
from kcoral_jupyter.display import format_size
from kcoral_jupyter.runner import InterruptedProgram, RunRecord

#: Seconds the exit hook waits to connect before it leaves the session to the idle timeout.
EXIT_CONNECT_TIMEOUT_SECONDS = 3.0


@dataclass
class NotebookSession:
    """The session the kernel's cells run in."""

    handle: ClientSession
    url: str
    token: str  # "" for none: the exit hook's fresh client needs it
    keep: bool  # not ended when the kernel exits
    ended_message: str | None = None  # set once the server said it ended

    @property
    def id(self) -> str:
        return self.handle.id

    @property
    def label(self) -> str:
        """Short and unambiguous enough for a status line (UUID4: 8 hex digits)."""
        return f"session {self.id[:8]}"

    @property
    def gpu_count(self) -> int | None:
        count = self.handle.record.get("gpu_count")
        return count if isinstance(count, int) and not isinstance(count, bool) else None


def require_sessions(url: str, features: list[str]) -> None:
    """Refuse, in two lines, a server that does not offer sessions."""
    if "sessions" not in features:
        raise SessionsUnavailableError(
            f"{url} does not offer sessions (its /v1/info features lack 'sessions')",
            "ask its operator for sessions (kcoral server --max-sessions N, N > 0), or run "
            "cells without a session",
        )


#: Why a session on this kernel's local server ended: the server stopped (SERVER §12 ends
#: every session at shutdown, EXTENSIONS §11).
LOCAL_SERVER_GONE = "this kernel's local server stopped, and its sessions ended with it"


def ended_clause(message: str | None) -> str:
    """How a session ended, after its name: the server's own words begin ``session ended``
    (``... after 4 s without a program``, ``...: job J did not stop``, ``... by its owner``),
    which read 'has ended: session ended ...' after it."""
    if not message or message == "ended":
        return "has ended"
    if message.startswith("session ended"):
        return "ended" + message.removeprefix("session ended")
    return f"has ended: {message}"


def ended_error(remote: NotebookSession) -> SessionEndedError:
    return SessionEndedError(
        f"{remote.label} on {remote.url} {ended_clause(remote.ended_message)}",
        "its variables are gone: %kcoral session start begins a new session, "
        "%kcoral session stop runs cells without one",
    )


def session_ended_under(remote: NotebookSession | None) -> TwoLineError | None:
    """When a session cell's job was cancelled: the session's end, if that is what it was
    (its Stop in the JupyterLab panel, a DELETE, an interrupt's grace passed), as two lines;
    else None (a cancel of the job alone, the session lives on). Before, the cell said
    "the job was cancelled … run the cell again", and the next cell failed: it had ended."""
    if remote is None:
        return None
    ended, _ = _end_or_live(remote)
    return ended


def _end_or_live(remote: NotebookSession) -> tuple[TwoLineError | None, bool]:
    """The session's end as two lines (or None), and whether its server said it lives."""
    try:
        record = remote.handle.info()
    except KCoralError as exc:
        return session_refusal(exc, remote), False  # 410 or 404: it ended
    except (TransportError, ProtocolError):  # not known: nothing said about an end
        return None, False
    if record.get("state") != "ENDED":
        return None, True
    message = record.get("end_message")
    remote.ended_message = message if isinstance(message, str) and message else "ended"
    return ended_error(remote), False


def ended_with_cell_hint(
    remote: NotebookSession | None, session_id: str, job_id: str | None
) -> str:
    """For a failed cell of session ``session_id`` (its job ``job_id``): a hint when the
    session ended with it (its worker exited, or it left threads running, EXTENSIONS §11),
    else "". Before, only the next cell said so, after the user had moved on believing the
    state was there; then it read "has ended with this cell (session ended: its worker
    exited during job <the id the line above names> (signal 9); its state is lost): its
    variables are gone"."""
    if remote is None or remote.id != session_id or session_ended_under(remote) is None:
        return ""
    why = end_reason_text({"end_message": remote.ended_message})
    if job_id:
        why = why.replace(f"job {job_id}", "the cell")
    why = why.removesuffix("; its state is lost")  # said next, as its variables
    return (
        f"hint: {remote.label} ended with this cell: {why}; its variables are gone, "
        "%kcoral session start begins a new session"
    )


def session_interrupted(remote: NotebookSession, record: RunRecord) -> TwoLineError:
    """An interrupted session cell (``record``), whose program got ``KeyboardInterrupt``
    (not a kill), was cancelled before it started (EXTENSIONS §11) or completed all the
    same (the interrupt came as it finished, or it caught it): the session's end
    when it ended (the program outlived the interrupt's grace), else what is known of its
    state. Before, a program seen to stop in a session the server still held read "the
    session keeps its state if the program stopped within 5 s (else the next cell says it
    ended)", a doubt the cell could have settled."""
    ended, live = _end_or_live(remote)
    if ended is not None:
        return ended
    ended_as = record.session_program
    if live and ended_as is InterruptedProgram.NEVER_RAN:  # no "KeyboardInterrupt raised"
        return CellCancelledError(
            f"interrupted before it started: {remote.label}'s program on {remote.url} never ran",
            "the session keeps its state: run the next cell",
        )
    if live and ended_as is InterruptedProgram.COMPLETED:
        return CellCancelledError(
            f"interrupted, but {remote.label}'s program on {remote.url} completed (the "
            "interrupt came as it finished, or it caught the KeyboardInterrupt)",
            "what it changed in the session is kept; its results were not brought back: "
            "run the next cell",
        )
    said = f"interrupted: KeyboardInterrupt raised in {remote.label}'s program on {remote.url}"
    if live and ended_as is not None:
        return CellCancelledError(
            said, "its program stopped and the session keeps its state: run the next cell"
        )
    return CellCancelledError(
        said,
        "the session keeps its state if the program stopped within 5 s (else the next cell "
        "says it ended); %kcoral session status shows it",
    )


def interrupted_status(remote: NotebookSession, record: RunRecord) -> str:
    """The status line of an interrupted session cell (``record``) whose session lives."""
    if record.session_program is InterruptedProgram.NEVER_RAN:
        return f"interrupted before it started: the cell never ran in {remote.label}"
    if record.session_program is InterruptedProgram.COMPLETED:
        return f"interrupted, but the cell completed in {remote.label}"
    return f"interrupted: KeyboardInterrupt raised in {remote.label}"


def session_unreachable(exc: TransportError, remote: NotebookSession) -> ServerUnreachableError:
    """The session's server does not answer. Its cells go there whatever the kernel's
    server is, so ``%kcoral connect`` or ``local start`` (the advice for a stateless cell)
    changed nothing: the way out is ending the session in this kernel."""
    if exc.answered_but:
        failure = answered_but_line(f"{remote.url}, where {remote.label} runs,", exc.answered_but)
    else:
        failure = f"no answer from {remote.url}, where {remote.label} runs: {root_reason(exc)}"
    return ServerUnreachableError(
        failure,
        "run the cell again once it answers; if that server stopped, the session ended with "
        "it: %kcoral session stop runs cells without it",
    )


def session_refusal(exc: KCoralError, remote: NotebookSession) -> TwoLineError | None:
    """A session program's refusal (410, 409, 404) as two lines; ``None`` for the others.
    A 410 or 404 marks the session ended: later cells refuse at once, saying why."""
    if exc.status_code == 410:
        remote.ended_message = exc.message or "ended"
        return ended_error(remote)
    if exc.status_code == 409:
        return SessionBusyError(
            f"{remote.label} is running another program (a --noblock job, or another kernel "
            "attached to it)",
            "run the cell again once that program has finished (%kcoral jobs lists jobs), or "
            "%kcoral session stop to end the session",
        )
    if exc.status_code == 404:
        restarted = restart_time_after_start(remote)
        if restarted is not None:  # its sessions ended with the old process
            remote.ended_message = f"its server restarted (at {restarted}); its state is lost"
            return SessionNotFoundError(
                f"{remote.label} ended when {remote.url} restarted (at {restarted}): its "
                "variables are gone",
                "%kcoral session start begins a new session, %kcoral session stop runs cells "
                "without one",
            )
        # A server that dropped the record after it ended, or one whose restart is not known
        remote.ended_message = (
            "the server no longer knows it (restarted, or dropped after it ended)"
        )
        return SessionNotFoundError(
            f"{remote.label} is unknown to {remote.url} (the server restarted, or dropped it "
            "after it ended)",
            "%kcoral session start begins a new session, %kcoral session stop runs cells "
            "without one",
        )
    return None


def restart_time_after_start(remote: NotebookSession) -> str | None:
    """When the session's server started after the session did (``HH:MM:SS UTC``, by the
    server's own clock), else None: not known, or not so. Before, a 404 after a restart
    read "unknown to URL (the server restarted, or dropped it after it ended)"."""
    created = finite_float(remote.handle.record.get("created_at"))
    try:
        started_at = remote.handle.client.health().get("started_at")
        started = datetime.fromisoformat(str(started_at).replace("Z", "+00:00"))
    except (KCoralError, TransportError, ProtocolError, ValueError):
        return None
    if created is None or started.tzinfo is None or started.timestamp() <= created:
        return None
    return started.astimezone(timezone.utc).strftime("%H:%M:%S UTC")


class SessionOfAnotherOwnerError(TwoLineError, PermissionError):
    """An admin's attach of another identity's session: only its owner runs programs in it
    (EXTENSIONS §11), so cells there would each be refused (403)."""


def another_owners_session(remote: NotebookSession, caller: object) -> TwoLineError | None:
    """Why an admin token (``caller``, its identity) cannot attach ``remote`` for its cells,
    or None when it may (its own, or an owner or identity the server does not say). Before,
    the attach said "%%kcoral cells run in it", each cell then failed 403 with advice about
    origins and hosts, and the only way out, %kcoral session stop, ended the owner's session."""
    owner = remote.handle.record.get("owner")
    if not isinstance(owner, str) or not isinstance(caller, str) or not owner or owner == caller:
        return None
    return SessionOfAnotherOwnerError(
        f"{remote.label} on {remote.url} is {owner}'s: only {owner}'s cells run in it "
        f"(your admin token, {caller}, may read, interrupt and end it)",
        "nothing was attached; the JupyterLab panel's Stop ends it",
    )


def creation_refusal(exc: KCoralError, url: str) -> TwoLineError | None:
    """``POST /v1/sessions``'s refusals a user can act on (its options, the seat limit) as
    two lines; ``None`` for the other errors."""
    if exc.status_code == 400:
        return SessionOptionsRefusedError(
            f"{url} refused the session's options: {exc.message}",
            "change --gpus or --idle as it says (%kcoral status shows info.sessions, with "
            "the server's idle_timeout_seconds cap)",
        )
    if exc.status_code == 503 and exc.kind != "busy":  # no node fits its --select, say
        return refused(exc, url)  # not "no session seat free", which sent users to end theirs
    if exc.status_code == 503:
        # The server's message says it already (EXTENSIONS §11): not twice in one line.
        said = exc.message.startswith("no session seat free")
        # At its per-identity cap, more seats would not let the caller in: that flag would.
        flag = (
            "--max-sessions-per-identity"
            if "--max-sessions-per-identity" in exc.message
            else "--max-sessions"
        )
        return SessionSeatsFullError(
            f"{url}: {exc.message}" if said else f"{url} has no session seat free: {exc.message}",
            # "%kcoral session stop" ends only this kernel's session: one held by another
            # kernel is ended by attaching to it first.
            "end one you no longer need (%kcoral session list, %kcoral session attach ID, "
            "then %kcoral session stop), wait for an idle one to time out, or ask the "
            f"operator for kcoral server {flag} N",
        )
    return None


def not_found_for_attach(session_id: str, url: str) -> SessionNotFoundError:
    return SessionNotFoundError(
        f"no session {session_id} on {url} for this kernel's token",
        "a session answers only the token that started it (KCoral.token / KCORAL_TOKEN); "
        "%kcoral session list shows yours",
    )


class SessionHolder:
    """At most one session per kernel: the one its cells run in."""

    def __init__(self) -> None:
        self.current: NotebookSession | None = None
        # The label of the session ``%kcoral session stop`` ended last: a stateless cell's
        # NameError then says where its names went.
        self.stopped_label: str | None = None
        self._exit_hook = False

    def active(self) -> NotebookSession | None:
        """The session cells run in (also one that has ended: cells then say so)."""
        return self.current

    def adopt(self, remote: NotebookSession) -> NotebookSession:
        self.current = remote
        self.stopped_label = None
        if not self._exit_hook:  # one hook for the kernel's lifetime, whatever it holds then
            atexit.register(self.end_at_exit)
            self._exit_hook = True
        return remote

    def server_gone(self, url: str, why: str) -> NotebookSession | None:
        """The server at ``url`` is gone with its sessions (this kernel's local server
        stopped or exited): the session there, if any and not yet ended, is marked ended
        with ``why`` and returned, so cells refuse in two lines. Before, they said "no
        answer from URL ... %kcoral local start gives this kernel its own", and after that
        start they still went to the dead address."""
        remote = self.current
        if remote is None or remote.url != url or remote.ended_message is not None:
            return None
        remote.ended_message = why
        return remote

    def stop(self) -> NotebookSession | None:
        """End the current session (idempotent on the server); the kernel leaves it either
        way, so a session the server lost does not trap the notebook."""
        remote = self.current
        if remote is None:
            return None
        self.current = None
        self.stopped_label = remote.label
        if remote.ended_message is None:
            remote.handle.close()
        return remote

    def end_at_exit(self) -> None:
        """The kernel process exits: end a session that is not kept. Never raises (nothing
        could show it); a server that does not answer leaves it to the idle timeout. A fresh
        client, because the extension may have closed the kernel's clients already."""
        remote = self.current
        if remote is None or remote.keep or remote.ended_message is not None:
            return
        try:
            client = Client(
                remote.url,
                token=remote.token or None,
                connect_timeout_seconds=EXIT_CONNECT_TIMEOUT_SECONDS,
            )
            try:
                ClientSession(client, {"session_id": remote.id}).close()  # no read first
            finally:
                client.close()
        except Exception:  # at exit there is no one to tell
            pass


def status_rows(
    record: Mapping[str, Any], remote: NotebookSession | None, now: float | None = None
) -> list[tuple[str, str]]:
    """What ``%kcoral session status`` shows: every value as text. ``idle deadline`` is in
    seconds from now by this machine's clock (the server's clock may differ a little)."""
    now = time.time() if now is None else now
    state = str(record.get("state"))
    rows = [("session", str(record.get("session_id"))), ("state", state)]
    if remote is not None:
        rows.append(("server", remote.url))
    rows.append(("programs", str(record.get("programs"))))
    gpu_ids = record.get("gpu_ids")
    rows.append(("GPU", f"{gpu_ids}" if gpu_ids else "none (CPU)"))
    if state == "ENDED":
        # the server's words once, not "worker_exited: session ended: its worker exited"
        rows.append(("ended", end_reason_text(record)))
        return rows  # its deadline, timeout and fate at this kernel's end are past
    memory = finite_float(record.get("memory_bytes"))  # a server's huge integer is none
    if memory is not None and 0 <= memory < 2**80:
        rows.append(("memory", f"{format_size(int(memory))} (its worker's resident memory)"))
    deadline = finite_float(record.get("idle_deadline"))
    if deadline is not None:
        rows.append(("idle deadline", f"in {max(0.0, deadline - now):.0f} s"))
    else:
        rows.append(("idle deadline", "none while a program runs"))
    rows.append(("idle timeout", seconds_text(record.get("idle_timeout_seconds"))))
    if remote is not None:
        rows.append(("when this kernel ends", "kept" if remote.keep else "ended"))
    return rows


def end_reason_text(record: Mapping[str, Any]) -> str:
    """Why an ended session ended, in the server's words after its ``session ended``
    (``after 5 s without a program``, ``its worker exited (signal 9); ...``); its
    ``end_reason`` where it sent no words."""
    message = record.get("end_message")
    if isinstance(message, str) and message.strip():
        return message.removeprefix("session ended").removeprefix(":").strip() or message
    return str(record.get("end_reason") or "ended")


def seconds_text(value: Any) -> str:
    """``600 s`` for a number, the value as text otherwise (a record is the server's; an
    integer too large for a float is text too)."""
    number = finite_float(value)
    if number is not None:
        return f"{number:g} s"
    return f"{value} s"


def after_stop_hint(
    result: ProgramResult,
    stopped_label: str | None,
    offers_sessions: bool = False,
    source: str = "",
) -> str:
    """For a ``NameError`` in a cell run without a session: where names went, after
    ``%kcoral session stop``; on a server offering sessions, that they are not kept (a
    restarted kernel has lost its session, and knows nothing of it: before, the cell said
    only ``NameError``, as if the name had never been defined; later, three lines that
    spoke of a session even where there had never been one)."""
    error = result.error or {}
    text = f"{error.get('message') or ''}\n{error.get('traceback') or ''}"
    if "NameError" not in text:
        return ""
    missing = re.search(r"NameError: name '(\w+)' is not defined", text)
    if missing and missing.group(1) in names_bound_only_inside(source):
        return ""  # a loop variable's or an argument's scope: no earlier cell's name
    if stopped_label is None:
        if not offers_sessions:
            return ""
        # One line, true whether or not an earlier cell defined the name (a typo too).
        return "hint: cells without a session keep no names; %kcoral session start keeps them"
    return (
        f"hint: cells run without a session since {stopped_label} was stopped; the names it "
        "held are gone (%kcoral session start begins a new one)"
    )


#: What opens a scope of its own: a name bound only in one is not the cell's top level.
_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def names_bound_only_inside(source: str) -> set[str]:
    """Names the cell binds only inside a function, lambda or comprehension (a loop
    variable, an argument), never at its top level: a NameError on one is the cell's own
    scoping, not a name an earlier cell defined (``w = w + 1`` still gets the hint)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    top: set[str] = set()
    inner: set[str] = set()

    def visit(node: ast.AST, inside: bool) -> None:
        into = inside or isinstance(node, _SCOPES)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            (inner if inside else top).add(node.id)
        elif isinstance(node, ast.arg):
            inner.add(node.arg)
        for child in ast.iter_child_nodes(node):
            visit(child, into)

    visit(tree, False)
    return inner - top
