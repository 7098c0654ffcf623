"""``/v1/revocations``: a node's server ends the work of an identity its router revoked
(EXTENSIONS §6, token reload; ROUTER §3).

A node's server holds no client tokens: its router does, and after a ``SIGHUP`` that
removed a name it tells each node so (``POST /v1/revocations/<name>``). The node then
cancels that identity's queued and running programs and ends its sessions, as a server with
its own token file does, and refuses the name's requests until the router admits it again
(``DELETE``): a request the router checked before the reload may reach the node after the
revocation. A node that was away then is told when it connects again: its router asks which
identities have work here and which are refused (``GET /v1/revocations``) and tells it what
changed. Only a node's server (one that serves its tunnel alone) has these endpoints, and
only its router sends them: the router forwards no client request to this path (ROUTER §8).
"""

from __future__ import annotations

from kcoral_server.front_door.handlers.base import BaseHandler
from kcoral_server.front_door.token_reload import end_identity_work, live_owners

#: an identity name (``callers._NAME``), as the router's path carries it
NAME_PATTERN = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.@-]{0,63})"


class RevocationsHandler(BaseHandler):
    """``GET``: the identities with work here, and those refused (revoked by the router)."""

    def get(self) -> None:
        revoked = sorted(self.state.router_revoked)
        self.send_json(200, {"working": sorted(live_owners(self.state)), "revoked": revoked})


class RevocationHandler(BaseHandler):
    ALLOWED: tuple[str, ...] = ("POST", "DELETE")

    def post(self, name: str) -> None:
        self.state.router_revoked.add(name)
        programs, sessions = end_identity_work(self.state, name)
        self.state.events.emit(
            "identity_revoked",
            "WARNING",
            identity=name,
            cancelled_programs=programs,
            ended_sessions=sessions,
        )
        self.send_json(200, {"cancelled_programs": programs, "ended_sessions": sessions})

    def delete(self, name: str) -> None:
        """The router lists ``name`` again: its requests are served from now on."""
        self.state.router_revoked.discard(name)
        self.send_json(200, {})
