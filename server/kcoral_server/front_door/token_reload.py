"""Revoking and adding client tokens without a restart: ``SIGHUP`` re-reads the
``--auth-token-file`` (EXTENSIONS §6).

Only on the signal, never on a file change: an editor or ``cp`` writes a file in pieces, and
a token file read half-written can parse (its first lines are whole), so a watcher would
revoke the identities not written yet and cancel their work. The operator's signal says the
file is complete; a Kubernetes Secret's sidecar sends the same signal.

A file that cannot be used (unreadable, over 1 MiB, empty, a malformed line, a token not
printable ASCII, a name or token twice) changes nothing: the old tokens stay and one
``token_reload_failed`` line names the file and the problem. A good one replaces every token
at once. Identities are matched by name: a name whose token changed keeps its jobs and
sessions (only the new token opens them), and a changed ``admin`` mark counts from the next
request. A name no longer listed is revoked: its token gets 401 from its next request on any
connection, its event streams end, and its queued and running programs (jobs, ``/execute``,
session programs) are cancelled and its sessions ended, saying the token was revoked; a
leaked token's programs must not run on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcoral_server.execution.responses import Refusal, RequestFailed
from kcoral_server.front_door.callers import (
    DEFAULT,
    IDENTITY_HEADER,
    NODE_HANGUP,
    Identity,
    is_bare_token,
    token_file_exposure,
)
from kcoral_server.front_door.token_file import ClientTokens, TokenFileError, read_client_tokens

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState

REVOKED_REASON = "token_revoked"
NO_FILE = (
    "SIGHUP: no --auth-token-file to reload (a KCORAL_AUTH_TOKEN or no token); nothing changed"
)


def revoked_message(name: str) -> str:
    return f"the token of identity {name} was revoked"


class TokenReload:
    """The server's ``SIGHUP`` handler, installed before start-up: a signal that arrives
    while the server starts (before its state exists) is applied once it does."""

    def __init__(self, token_file: Path | None) -> None:
        self.token_file = token_file
        self.state: ServerState | None = None
        self.pending = False

    def attach(self, state: ServerState) -> None:
        self.state = state
        if self.pending:
            self.pending = False
            self.hangup()

    def hangup(self) -> None:
        if self.state is None:
            self.pending = True
            return
        reload_tokens(self.state, self.token_file)


@dataclass(frozen=True)
class TokenChange:
    """A token file read anew (parsed once: its tokens are served as they are), and what
    it changes against the tokens served."""

    read: ClientTokens
    before: dict[str, Identity]
    after: dict[str, Identity]

    @property
    def revoked(self) -> list[str]:
        return sorted(set(self.before) - set(self.after))

    @property
    def added(self) -> list[str]:
        return sorted(set(self.after) - set(self.before))

    def fields(self) -> dict[str, Any]:
        """The ``tokens_reloaded`` line's fields: names, never tokens."""
        kept = set(self.before) & set(self.after)
        return {
            "identities": len(self.after),
            "added": self.added,
            "revoked": self.revoked,
            "admin_changed": sorted(
                name for name in kept if self.before[name].admin != self.after[name].admin
            ),
        }


#: a reload never turns a file of named identities into one bare token (EXTENSIONS §6)
BARE_AFTER_NAMED = "holds a bare token where it named identities: restart to change its form"


def _named(names: Iterable[str]) -> bool:
    """Whether ``names`` come from ``NAME TOKEN`` lines (a bare token is ``default``)."""
    return any(name != DEFAULT.name for name in names)


def read_token_change(
    token_file: Path,
    before: dict[str, Identity],
    emit: Callable[..., None],
    refuse: Callable[[dict[str, Identity]], str | None] | None = None,
) -> TokenChange | None:
    """The file's tokens against ``before`` (name -> identity: identities match by name),
    for a server's and a router's reload alike; None when the file cannot be used, said
    through ``emit`` (``token_reload_failed``: the file and the problem), ``refuse``'s
    problem with its tokens included (a router's: a client token that is a node token). A
    file others can read or write is used with a ``token_file_open`` warning, as at start."""
    try:
        read = read_client_tokens(token_file, regular_only=True)
        problem = refuse(read.tokens) if refuse is not None else None
        # by the file's form: "default TOKEN" names an identity, as the bare token's reads
        if problem is None and _named(before) and is_bare_token(read.text):
            # One word left of a "NAME TOKEN" file (a line cut short, the rest deleted)
            # parses as a bare token: every identity revoked, their programs cancelled, and
            # that word (a name, often) a valid token (fleet soak).
            problem = BARE_AFTER_NAMED
        if problem is not None:
            raise TokenFileError(problem)
    except TokenFileError as exc:
        # Not the path again (its own field): a router cuts each value at 120 characters
        # (ROUTER §10), and a long path left the problem cut off.
        why = f"the token file {exc}; the old tokens stay"
        emit("token_reload_failed", "ERROR", path=str(token_file), message=why)
        return None
    exposure = token_file_exposure(token_file)
    if exposure is not None:  # applied all the same, as at start
        emit("token_file_open", "WARNING", message=exposure, path=str(token_file))
    after = {who.name: who for who in read.tokens.values()}
    return TokenChange(read, before, after)


def reload_tokens(state: ServerState, token_file: Path | None) -> None:
    """Apply ``token_file`` anew, or keep the old tokens and say why not."""
    events = state.events
    if token_file is None:
        tunnel_only = state.authenticator.tunnel_only  # a node's child: its router's tokens
        events.emit("token_reload_skipped", message=NODE_HANGUP if tunnel_only else NO_FILE)
        return
    change = read_token_change(token_file, state.authenticator.identities(), events.emit)
    if change is None:
        return
    state.use_tokens(change.read)
    ended = [end_identity_work(state, name) for name in change.revoked]
    events.emit(
        "tokens_reloaded",
        "WARNING" if change.revoked else "INFO",
        path=str(token_file),
        **change.fields(),
        cancelled_programs=sum(programs for programs, _ in ended),
        ended_sessions=sum(sessions for _, sessions in ended),
    )
    # Open event streams re-check their caller against the new tokens when woken.
    for job in list(state.jobs.jobs.values()):
        for listener in list(job.listeners):
            listener.set()


def revoked_refusal(state: ServerState, identity: Identity, since: float) -> RequestFailed | None:
    """The 401 of a program whose caller was revoked after its head was checked (at
    ``since``, monotonic): its body was still arriving, so there was nothing to cancel yet.
    A later request of the same name (re-admitted by a later reload) goes on."""
    revoked_at = state.revoked_at.get(identity.name)
    if revoked_at is None or revoked_at < since:
        return None
    return revoked_answer(identity.name)


def router_revoked(
    state: ServerState, identity: Identity, headers: Mapping[str, str]
) -> Refusal | None:
    """A node's server: the 401 of a request in the name of an identity its router revoked
    (``POST /v1/revocations/<name>``) and has not admitted again. The router checked the
    token before it revoked it, but the head came after the revocation (on a worker slot,
    the revocation on a control slot: nothing orders the two), so no program of the name
    was there to cancel; the router's own requests (no identity header) are never refused."""
    if identity.name not in state.router_revoked or headers.get(IDENTITY_HEADER) is None:
        return None
    return Refusal(401, "unauthorized", revoked_message(identity.name), "rejected")


def live_owners(state: ServerState) -> set[str]:
    """The identities with work here: a job not finished, a request, a live session."""
    owners = {job.owner for job in list(state.jobs.jobs.values()) if not job.finished}
    owners.update(request.identity.name for request in list(state.live_requests))
    owners.update(session.owner for session in state.sessions.live())
    return owners


def revoked_answer(name: str) -> RequestFailed:
    """What a revoked identity's program answers a client still waiting for it."""
    message = f"{revoked_message(name)}; its program was cancelled"
    return RequestFailed(401, "unauthorized", message, "cancelled")


def end_identity_work(state: ServerState, name: str) -> tuple[int, int]:
    """Cancel every queued or running program of the revoked identity ``name`` and end its
    sessions; how many of each."""
    state.revoked_at[name] = time.monotonic()  # requests still arriving are refused
    message = revoked_message(name)
    answer = revoked_answer(name)
    for job in list(state.jobs.jobs.values()):
        if job.owner == name and not job.finished:
            job.revoked = True
    programs = sum(
        1
        for request in list(state.live_requests)
        if request.identity.name == name and request.cancel("cancelled", answer)
    )
    sessions = [s for s in state.sessions.live() if s.owner == name]
    for session in sessions:
        session.end(REVOKED_REASON, f"session ended: {message}")
    return programs, len(sessions)
