"""``%kcoral session start|stop|status|attach|list`` (EXTENSIONS §11): the KCoral session the
kernel's cells run in (``notebook_session.py`` holds it; ``cell.py`` runs cells in it)."""

from __future__ import annotations

import argparse
import math
import sys
import uuid
from collections.abc import Mapping
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.display import display

from kcoral import Client, KCoralError, TransportError
from kcoral.client_sessions import Session
from kcoral.errors import root_reason
from kcoral_jupyter import display as rich
from kcoral_jupyter.cell_errors import (
    CellCancelledError,
    SessionEndedError,
    answered_by,
    shorten,
)
from kcoral_jupyter.kernel_state import KernelState
from kcoral_jupyter.magics.jobs import UNKNOWN, owner_of
from kcoral_jupyter.notebook_session import (
    LOCAL_SERVER_GONE,
    NotebookSession,
    another_owners_session,
    creation_refusal,
    ended_error,
    not_found_for_attach,
    require_sessions,
    seconds_text,
    session_refusal,
    session_unreachable,
    status_rows,
)
from kcoral_jupyter.runner import HeldInterrupt


class SessionCommands:
    """Starting, ending, showing and picking up the kernel's session."""

    def __init__(self, kernel: KernelState) -> None:
        self.kernel = kernel

    def _server(self, what: str) -> tuple[str, Client]:
        """The kernel's server for a new or attached session, which must offer sessions;
        refused while the kernel is in a session that has not ended."""
        remote = self.kernel.sessions.active()
        if remote is not None and remote.ended_message is None:
            raise UsageError(
                f"%kcoral session {what}: this kernel's cells run in {remote.label} on "
                f"{remote.url}; %kcoral session stop ends it first"
            )
        return self._offering_server()

    def _offering_server(self) -> tuple[str, Client]:
        """The kernel's server, which must offer sessions; a refusal names it."""
        url = self.kernel.resolve_url()
        with answered_by(url):
            features = self.kernel.facts(url).features
        require_sessions(url, features)
        return url, self.kernel.client(url)

    def start(self, args: argparse.Namespace) -> None:
        if args.gpus is not None and args.gpus < 1:  # checked here too: a CPU server drops it
            raise UsageError("%kcoral session start: --gpus must be 1 or more")
        if args.idle is not None and not (math.isfinite(args.idle) and args.idle > 0):
            # named as the user wrote it: the client's refusal names its idle_timeout
            raise UsageError(
                f"%kcoral session start: --idle must be a number of seconds above 0, "
                f"not {args.idle:g}"
            )
        url, client = self._server("start")
        facts = self.kernel.facts(url)
        gpu_count = args.gpus
        # With --select a router picks the node: its facts (its default kind) say nothing
        # about that node's GPUs. A direct server is the node, selector or not.
        routed = args.select is not None and facts.router
        if gpu_count is not None and facts.gpu_count == 0 and not routed:
            print(f"kcoral: warning: {url} has no GPU: the session runs on CPU", file=sys.stderr)
            gpu_count = None  # a CPU server takes no gpu_count (EXTENSIONS §11)
        try:
            # The first interrupt is held until the server answers: one that landed as its
            # 201 was read left a started session, IDLE with an id nobody knew, holding a
            # seat until its idle timeout (the server ends only one whose client left
            # before its 201). A second leaves at once.
            with HeldInterrupt() as held:
                handle = client.session(
                    gpu_count=gpu_count, idle_timeout=args.idle, select=args.select
                )
        except ValueError as exc:
            raise UsageError(f"%kcoral session start: {exc}") from None
        except KCoralError as exc:
            raise (creation_refusal(exc, url) or shorten(exc, url)) from exc
        except KeyboardInterrupt:
            # The start can take seconds (its worker, a GPU's lease); the server ends a
            # session whose client left before its 201 (EXTENSIONS §11). Before, the
            # interrupt showed a whole traceback through the HTTP library.
            raise CellCancelledError(
                f"interrupted: no session was started on {url} (the server ends one whose "
                "start was left)",
                "%kcoral session start again to start one; %kcoral session list shows yours",
            ) from None
        if held.noted:
            ended_at_once(handle, url)
        remote = self.kernel.sessions.adopt(
            NotebookSession(handle, url, self.kernel.token_for(url), keep=args.keep)
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

    def stop(self, args: argparse.Namespace) -> None:
        try:
            remote = self.kernel.sessions.stop()
        except (TransportError, KCoralError) as exc:
            # The kernel has left it all the same (SessionHolder.stop): say that, not only
            # the failure, which read as if the session were still this kernel's.
            left = self.kernel.sessions.stopped_label
            reason = root_reason(exc) if isinstance(exc, TransportError) else str(exc)
            print(
                f"kcoral: left {left}, but its server did not end it ({reason}): if that "
                "server still runs, the session ends after its idle timeout; cells run "
                "without a session again"
            )
            return
        if remote is None:
            print("kcoral: no session in this kernel (cells run without one)")
            return
        if remote.ended_message is not None:  # nothing ended now: it said "ended on URL"
            print(
                f"kcoral: left {remote.label}, which had already ended; cells run without a "
                "session again"
            )
            return
        print(
            f"kcoral: {remote.label} ended on {remote.url} (its state is gone); cells run "
            "without a session again"
        )

    def status(self, args: argparse.Namespace) -> None:
        remote = self.kernel.sessions.active()
        if remote is None:
            print("kcoral: no session in this kernel (%kcoral session start begins one)")
            return
        if self.kernel.local_gone(remote.url):  # ended with this kernel's local server,
            self.kernel.sessions.server_gone(remote.url, LOCAL_SERVER_GONE)
            raise ended_error(remote)  # which is not there to ask
        try:
            record = remote.handle.info()
        except TransportError as exc:
            raise session_unreachable(exc, remote) from exc
        except KCoralError as exc:
            refusal = session_refusal(exc, remote)
            if refusal is None:
                raise
            raise refusal from exc
        if record.get("state") == "ENDED":
            remote.ended_message = str(record.get("end_message") or "ended")
        display(rich.rows_bundle(status_rows(record, remote)), raw=True)

    def attach(self, args: argparse.Namespace) -> None:
        session_id: str = args.session_id
        if not is_session_id(session_id):
            raise UsageError(f"%kcoral session attach: {session_id!r} is not a session id")
        url, client = self._server("attach")
        try:
            handle = client.attach_session(session_id)
        except KCoralError as exc:
            if exc.status_code == 404:
                raise not_found_for_attach(session_id, url) from exc
            raise shorten(exc, url) from exc
        remote = NotebookSession(handle, url, self.kernel.token_for(url), keep=True)
        if handle.record.get("state") == "ENDED":
            remote.ended_message = str(handle.record.get("end_message") or "ended")
            # Not ended_error's "%kcoral session stop runs cells without one": nothing was
            # attached, so this kernel has no such session to stop.
            raise SessionEndedError(
                ended_error(remote).cause,
                "nothing was attached: %kcoral session list shows your sessions, %kcoral "
                "session start begins a new one",
            )
        with answered_by(url):
            refusal = another_owners_session(remote, client.info().get("identity"))
        if refusal is not None:
            raise refusal
        self.kernel.sessions.adopt(remote)
        print(
            f"kcoral: attached to {remote.label} on {url} ({session_place(handle.record)}, "
            f"{programs_text(handle.record)} so far); %%kcoral cells run in it; "
            "it is kept when this kernel ends (%kcoral session stop ends it)"
        )

    def list_sessions(self, args: argparse.Namespace) -> None:
        if self.kernel.running_url() is None:  # not started (seconds) only to list nothing
            why = (
                "this kernel's local server has stopped, and its sessions ended with it"
                if self.kernel.gone_local
                else "no server configured, and this kernel's local server has not started yet"
            )
            print(f"kcoral: no sessions: {why}")
            return
        url, client = self._offering_server()
        with answered_by(url):
            records = client.sessions()
        if not records:
            print(f"kcoral: no sessions of yours on {url}")
            return
        whose = names_owners(client, {owner_of(record) for record in records})
        for record in records:
            owner = f"  owner {owner_of(record) or UNKNOWN}" if whose else ""
            # An ended one says why: "ENDED" alone left the user guessing whether their own
            # stop, the idle timeout or a crash had ended it.
            reason = record.get("end_reason") if record.get("state") == "ENDED" else None
            state = f"ENDED ({end_reason_words(reason)})" if reason else str(record.get("state"))
            print(
                f"{record.get('session_id')}  {state}  "
                f"{programs_text(record)}  {session_place(record)}{owner}"
            )


def names_owners(client: Client, owners: set[str | None]) -> bool:
    """Whether ``%kcoral session list`` names each session's owner. An admin lists every
    identity's sessions (EXTENSIONS §11): named where there are several owners, and where
    all are one other identity's (they read as the admin's own). Where ``/v1/info`` does not
    say who asks (it fails: a router relaying it to a node that stopped answering), they are
    named too: the list the user asked for was lost with that question."""
    named = owners - {None}
    if len(owners) > 1 or not named:
        return len(owners) > 1
    try:
        caller = client.info().get("identity")
    except (TransportError, KCoralError):
        return True
    return isinstance(caller, str) and caller not in named


#: an end_reason (EXTENSIONS §11) as the JupyterLab panel words it: "deleted" read as if
#: the user had deleted something after a kernel's restart had ended its session
END_REASON_WORDS = {
    "deleted": "stopped",
    "idle_timeout": "idle too long",
    "worker_exited": "its worker exited",
    "timeout": "a program ran past its time limit",
    "interrupt_grace": "a program would not stop",
    "leftover_work": "a program left work running",
    "shutdown": "the server shut down",
}


def end_reason_words(reason: object) -> str:
    """An ended session's ``end_reason`` in words; another server's own reason as it is."""
    text = str(reason)
    return END_REASON_WORDS.get(text, text.replace("_", " "))


def programs_text(record: dict[str, Any]) -> str:
    """``1 program``, ``3 programs``: a session record's count of programs run."""
    count = record.get("programs")
    return f"{count} program" if count == 1 else f"{count} programs"


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


def ended_at_once(handle: Session, url: str) -> NoReturn:
    """End a session whose start was interrupted once the server had started it, and say
    so (the start's interrupt was held until then)."""
    try:
        handle.close()
    except (KCoralError, TransportError) as exc:
        reason = root_reason(exc) if isinstance(exc, TransportError) else str(exc)
        raise CellCancelledError(
            f"interrupted: the session that had started on {url} could not be ended "
            f"({reason}); it ends after its idle timeout",
            f"%kcoral session attach {handle.id} then %kcoral session stop ends it now",
        ) from None
    raise CellCancelledError(
        f"interrupted: the session that had started on {url} was ended",
        "%kcoral session start again to start one",
    )
