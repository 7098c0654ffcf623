"""``GET /health``, ``GET /internal/worker-status`` and ``GET /v1/info``."""

from __future__ import annotations

from typing import cast

from tornado.http1connection import HTTP1Connection  # what Tornado's HTTPServer hands us

import kcoral
from kcoral_server.front_door.body import held_descriptors
from kcoral_server.front_door.handler_defaults import UNLIMITED
from kcoral_server.front_door.handlers.base import BaseHandler
from kcoral_server.front_door.optional_pieces import optional_pieces

PROTOCOL_VERSION = 1


class HealthHandler(BaseHandler):
    """PROTOCOL §12: exactly the documented keys; no token needed."""

    PUBLIC = True

    def get(self) -> None:
        self.send_json(200, self.state.health())


class WorkerStatusHandler(BaseHandler):
    """PROTOCOL §13: loopback peers only (others get 404); no token needed, but without one
    the session seats are counts only.

    Any local process can reach this endpoint, and published supervisors call it without a
    token, so it stays open; but session ids, owners and worker pids are what one user
    needed to find another user's session worker (and, without a sandbox, read its
    memory), so only a caller this server authenticates sees them: a client token, the
    router secret, or anyone on a server without tokens (one identity, which owns every
    session there already). A client token sees the seats of the sessions it may see
    (its own; every one for an admin): another token holder's session ids, owner and
    worker pid are the same map."""

    PUBLIC = True

    def prepare(self) -> None:
        if not self.is_loopback_peer():  # before any body is read
            self.set_header("X-Request-ID", self.request_id)
            self.answer_early(404, "not_found", "not found")
            cast(HTTP1Connection, self.request.connection).set_max_body_size(UNLIMITED)
            return
        super().prepare()

    def get(self) -> None:
        pool = self.state.pool
        seats = self.state.sessions.seats()
        caller = self.state.authenticate(self.request.headers)
        # seats held by sessions, beyond worker_count (EXTENSIONS §11); who holds them only
        # for an authenticated caller, and only the ones it may see: a node's child answers
        # its supervisor alone (the router secret), which sees every seat
        described: dict[str, object] = {}
        if caller is not None:
            everyone = caller.admin or self.state.authenticator.tunnel_only
            visible = [seat for seat in seats if everyone or caller.owns(seat["owner"])]
            described["session_seats"] = visible
        if self.state.authenticator.tunnel_only:
            # A node's child (every caller here holds the router secret: its supervisor):
            # what its recent programs held, for the router's estimated wait (ROUTER §6).
            stats = {**self.state.recent_leases.summary(), "queued": pool.requests_waiting}
            described["lease_stats"] = stats
        self.send_json(
            200,
            {
                "status": "ok",
                "instance_id": self.state.instance_id,
                "target": dict(pool.target),
                "versions": dict(pool.versions),
                "worker_count": len(pool.seats),
                "busy_workers": pool.busy_workers,
                # descriptors the memory cache keeps open on purpose (leak checks: PROTOCOL §13)
                "cache_descriptors": self.state.memory_cache.held_descriptors(held_descriptors),
                "session_seat_count": len(seats),
                # SIGTERM'd (SERVER §12): a node's supervisor reports the node `draining`,
                # so its router sends it nothing new (ROUTER §6); "ok" all the same, as the
                # server still answers what it holds
                "draining": self.state.shutting_down,
                **described,
            },
        )


class InfoHandler(BaseHandler):
    """EXTENSIONS §1: version, features, device and limits."""

    def get(self) -> None:
        config = self.state.config
        # cancel-unfollowed: X-KCoral-Cancel-Unfollowed is honoured (EXTENSIONS §5, §7)
        features = ["cpu-tensors", "async-run", "serialization", "jobs", "cancel-unfollowed"]
        features.append("output-order")  # X-KCoral-Output-Order is honoured (EXTENSIONS §16)
        if self.state.auth_token is not None:
            features.append("auth")
        sessions = self.state.sessions
        if sessions.max > 0:  # EXTENSIONS §11
            features.append("sessions")
        # Who the caller is, where tokens make a difference (EXTENSIONS §1, §6).
        identity = {} if self.state.authenticator.open else {"identity": self.identity.name}
        self.send_json(
            200,
            {
                **identity,
                "kcoral": kcoral.__version__,
                "protocol": PROTOCOL_VERSION,
                "features": features,
                # what the kcoral[gpu] extra adds, per the workers' versions (EXTENSIONS §1)
                "optional": optional_pieces(self.state.device, self.state.pool.versions),
                "device": self.state.device,
                # the resolved mode: what confines programs here (EXTENSIONS §1, §6)
                "sandbox": self.state.sandbox,
                "sessions": sessions.info(self.identity),
                "limits": {
                    "max_request_bytes": config.max_request_bytes,
                    "max_response_bytes": config.max_response_bytes,
                    "max_timeout_seconds": config.max_timeout_seconds,
                    "max_output_limit_bytes": config.max_output_limit_bytes,
                },
            },
        )
