"""``POST /v1/revocations/{name}``: a node's server ends the work of an identity its router
revoked (EXTENSIONS §6, token reload; ROUTER §3).

A node's server holds no client tokens: its router does, and after a ``SIGHUP`` that
removed a name it tells each node so. The node then cancels that identity's queued and
running programs and ends its sessions, as a server with its own token file does. Only a
node's server (one that serves its tunnel alone) has this endpoint, and only its router
sends it: the router forwards no client request to this path (ROUTER §8).
"""

from __future__ import annotations

from kcoral_server.front_door.handlers.base import BaseHandler
from kcoral_server.front_door.token_reload import end_identity_work

#: an identity name (``callers._NAME``), as the router's path carries it
NAME_PATTERN = r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.@-]{0,63})"


class RevocationHandler(BaseHandler):
    ALLOWED: tuple[str, ...] = ("POST",)

    def post(self, name: str) -> None:
        programs, sessions = end_identity_work(self.state, name)
        self.state.events.emit(
            "identity_revoked",
            "WARNING",
            identity=name,
            cancelled_programs=programs,
            ended_sessions=sessions,
        )
        self.send_json(200, {"cancelled_programs": programs, "ended_sessions": sessions})
