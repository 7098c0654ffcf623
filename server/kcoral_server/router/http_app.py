"""The router's client side: ``GET /health``, streaming ``POST /execute`` (ROUTER.md §8–§9),
``/v1/info``, the jobs endpoints (``job_routes``), the sessions endpoints
(``session_routes``) and ``/metrics`` (``metrics_route``); all but ``/health`` need the client
token when one is set."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import tornado.web

from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.front_door.callers import Authenticator, parse_tokens, token_file_exposure
from kcoral_server.front_door.handler_defaults import TOO_LARGE_MESSAGE, KCoralRequestHandler
from kcoral_server.front_door.token_reload import NO_FILE, read_token_change
from kcoral_server.metrics.router_metrics import RouterMetrics
from kcoral_server.router.auth import (
    NotFoundHandler,
    browser_refusal,
    error_answer,
    settle_unread_body,
)
from kcoral_server.router.forward import ProgramForwardHandler
from kcoral_server.router.job_routes import InfoHandler, JobHandler, JobIndex, JobsHandler, fetch
from kcoral_server.router.log import RouterLog
from kcoral_server.router.metrics_route import RouterMetricsHandler
from kcoral_server.router.registry import Registry
from kcoral_server.router.scheduler import Admission, ControlAdmission
from kcoral_server.router.session_routes import SessionHandler, SessionIndex, SessionsHandler
from kcoral_server.router.settings import RouterSettings


@dataclass
class RouterState:
    """Everything the handlers share (one per router process)."""

    settings: RouterSettings
    registry: Registry
    admission: Admission
    log: RouterLog
    control: ControlAdmission
    instance_id: str
    started_at: str
    in_progress: int = 0  # requests on worker slots (control requests are not load)
    started_monotonic: float = field(default_factory=time.monotonic)
    jobs: JobIndex = field(default_factory=JobIndex)
    sessions: SessionIndex = field(default_factory=SessionIndex)
    authenticator: Authenticator = field(init=False)
    metrics: RouterMetrics = field(init=False)  # EXTENSIONS §13

    def __post_init__(self) -> None:
        # The client-token file has the server's format (EXTENSIONS §6): one bare token
        # (identity ``default``) or ``NAME TOKEN [admin]`` lines; none = everyone ``default``.
        tokens = self.settings.auth_token
        self.authenticator = Authenticator(parse_tokens(tokens) if tokens is not None else None)
        self.metrics = RouterMetrics()
        self.metrics.attach(self)
        self._revoking: set[asyncio.Task[None]] = set()

    def reload_tokens(self) -> None:
        """SIGHUP: read ``--auth-token-file`` again (EXTENSIONS §6, token reload). A bad file
        keeps the old tokens; a good one replaces them from the next request (a request
        still queued for a slot is checked again once it has one, ``ForwardHandler``), and
        every connected node ends the work of each revoked identity."""
        path = self.settings.auth_token_file
        if path is None:
            self.log.event("token_reload_skipped", message=NO_FILE)
            return
        try:
            change = read_token_change(Path(path), self.authenticator.identities())
        except ValueError as exc:
            self.log.event("token_reload_failed", level="ERROR", path=path, message=str(exc))
            return
        exposure = token_file_exposure(path)
        if exposure is not None:  # applied all the same, as at start
            self.log.event("token_file_open", level="WARNING", message=exposure, path=path)
        self.authenticator = Authenticator(parse_tokens(change.text))
        level = "WARNING" if change.revoked else "INFO"
        self.log.event("tokens_reloaded", level=level, path=path, **change.fields())
        for name in change.revoked:
            task = asyncio.ensure_future(self._revoke_on_nodes(name))
            self._revoking.add(task)
            task.add_done_callback(self._revoking.discard)

    async def _revoke_on_nodes(self, name: str) -> None:
        """Each connected node cancels ``name``'s programs and ends its sessions there."""
        nodes = [node_id for node_id, node in self.registry.nodes.items() if node.connected]
        answers = await asyncio.gather(
            *(fetch(self, node_id, "POST", f"/v1/revocations/{name}", []) for node_id in nodes)
        )
        reached = [answer is not None and answer[0] == 200 for answer in answers]
        unreached = [node for node, ok in zip(nodes, reached, strict=True) if not ok]
        self.log.event(
            "identity_revoked",
            level="WARNING",
            identity=name,
            nodes=len(nodes) - len(unreached),
            unreached=unreached or None,
        )


def utc_now_micros() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@tornado.web.stream_request_body
class HealthHandler(KCoralRequestHandler):
    def initialize(self, state: RouterState) -> None:
        self.state = state
        self.request_id = str(uuid.uuid4())

    def prepare(self) -> None:
        # No token is needed here, but a web page still learns nothing (EXTENSIONS §6).
        refusal = browser_refusal(self.state, self.request.headers)
        if refusal is not None:
            self.finish(error_answer(self, self.request_id, 403, "forbidden", refusal))
        elif self.request.method not in self.ALLOWED:
            self.set_header("Allow", ", ".join(self.ALLOWED))
            self.finish(
                error_answer(self, self.request_id, 405, "method_not_allowed", "method not allowed")
            )
        if not settle_unread_body(self, self.state.settings.request_head_timeout_seconds):
            self.finish(
                error_answer(self, self.request_id, 413, "request_too_large", TOO_LARGE_MESSAGE)
            )

    def data_received(self, chunk: bytes) -> None:
        """No body is read here: what arrives (at most 64 KiB) is dropped."""

    def get(self) -> None:
        state = self.state
        ok = state.registry.any_ready_with_slots()
        baseline = state.registry.baseline or ({}, {})
        body = {
            "status": "ok" if ok else "unavailable",
            "instance_id": state.instance_id,
            "started_at": state.started_at,
            "gpu_count": None,
            "load": {
                "request_capacity": state.registry.capacity(),
                "requests_in_progress": state.in_progress,
                "requests_waiting": state.admission.waiting,
            },
            "target": baseline[0],
            "versions": baseline[1],
        }
        self.set_status(200 if ok else 503)
        self.set_header("Content-Type", "application/json")
        self.finish(dumps_compact(body))


class ExecuteHandler(ProgramForwardHandler):
    """``POST /execute`` (ROUTER.md §8)."""


def make_app(state: RouterState) -> tornado.web.Application:
    return tornado.web.Application(
        [
            (r"/health", HealthHandler, {"state": state}),
            (r"/execute", ExecuteHandler, {"state": state}),
            (r"/v1/info", InfoHandler, {"state": state}),
            (r"/v1/jobs", JobsHandler, {"state": state}),
            (r"/v1/jobs/([^/]+)(/events|/result)?", JobHandler, {"state": state}),
            (r"/v1/sessions", SessionsHandler, {"state": state}),
            (r"/v1/sessions/([^/]+)(/execute|/jobs|/interrupt)?", SessionHandler, {"state": state}),
            (r"/metrics", RouterMetricsHandler, {"state": state}),
        ],
        default_handler_class=NotFoundHandler,
        default_handler_args={"state": state},
        # request_finished is the router's access log; Tornado's would duplicate it.
        log_function=lambda handler: None,
    )
