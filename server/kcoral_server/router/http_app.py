"""The router's client side: ``GET /health``, streaming ``POST /execute`` (ROUTER.md §8–§9),
``/v1/info``, the jobs endpoints (``routes.jobs``), the sessions endpoints
(``routes.sessions``) and ``/metrics`` (``routes.metrics``); all but ``/health`` need the client
token when one is set."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import tornado.web

from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.front_door.callers import (
    Authenticator,
    parse_tokens,
    valid_identity_name,
)
from kcoral_server.front_door.handler_defaults import TOO_LARGE_MESSAGE, KCoralRequestHandler
from kcoral_server.front_door.token_reload import NO_FILE, read_token_change
from kcoral_server.metrics.router_metrics import RouterMetrics
from kcoral_server.router.admission.scheduler import Admission, ControlAdmission
from kcoral_server.router.auth import (
    NotFoundHandler,
    browser_refusal,
    error_answer,
    settle_unread_body,
)
from kcoral_server.router.forwarding.forward import ProgramForwardHandler
from kcoral_server.router.identity import node_token_clash
from kcoral_server.router.log import RouterLog
from kcoral_server.router.nodes.registry import Registry
from kcoral_server.router.nodes.slot import CONTROL
from kcoral_server.router.routes.fan_out import fetch, untrusted_json
from kcoral_server.router.routes.fleet_limits import FleetLimits
from kcoral_server.router.routes.info import InfoHandler
from kcoral_server.router.routes.job_index import JobIndex
from kcoral_server.router.routes.jobs import JobHandler, JobsHandler
from kcoral_server.router.routes.metrics import RouterMetricsHandler
from kcoral_server.router.routes.session_index import SessionIndex, SessionInventory
from kcoral_server.router.routes.sessions import SessionHandler, SessionsHandler
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
    #: the nodes' request size limits, for ``/v1/info``'s ``fleet_limits`` (ROUTER §13)
    fleet_limits: FleetLimits = field(default_factory=FleetLimits)
    #: job event streams being relayed (``JobHandler``): a reload checks their callers again
    event_relays: set[Any] = field(default_factory=set)
    #: sessions' programs being relayed (on control slots): a stop waits for them within
    #: ``--stop-grace-seconds`` as for programs on worker slots
    session_programs: set[Any] = field(default_factory=set)
    authenticator: Authenticator = field(init=False)
    metrics: RouterMetrics = field(init=False)  # EXTENSIONS §13

    def __post_init__(self) -> None:
        # The client-token file has the server's format (EXTENSIONS §6): one bare token
        # (identity ``default``) or ``NAME TOKEN [admin]`` lines; none = everyone ``default``.
        tokens = self.settings.auth_token
        self.authenticator = Authenticator(parse_tokens(tokens) if tokens is not None else None)
        self.metrics = RouterMetrics()
        self.metrics.attach(self)
        self.revocations = NodeRevocations(self)  # what the nodes hear of a reload
        self.inventory = SessionInventory(self)  # what nodes hold as they connect (ROUTER §13)

    def reload_tokens(self) -> None:
        """SIGHUP: read ``--auth-token-file`` again (EXTENSIONS §6, token reload). A bad file
        keeps the old tokens; a good one replaces them from the next request (a request
        still queued for a slot is checked again once it has one, ``ForwardHandler``), and
        every node ends the work of each revoked identity (``router.revocation``)."""
        path = self.settings.auth_token_file
        if path is None:
            self.log.event("token_reload_skipped", message=NO_FILE)
            return
        settings = self.settings
        change = read_token_change(
            Path(path),
            self.authenticator.identities(),
            self.log.event,
            lambda tokens: node_token_clash(tokens, settings.node_token, settings.node_tokens),
        )
        if change is None:
            return
        self.authenticator = Authenticator(change.read.tokens)
        level = "WARNING" if change.revoked else "INFO"
        self.log.event("tokens_reloaded", level=level, path=path, **change.fields())
        self.revocations.reloaded(change.revoked, change.added)
        for relay in list(self.event_relays):
            relay.tokens_reloaded()


EVERYONE = "default"  # the identity of every caller of a router without client tokens


class NodeRevocations:
    """What the nodes hear of the router's revocations (EXTENSIONS §6, token reload;
    ROUTER §3), one per router. A node holds no client tokens: the router's ``SIGHUP``
    reaches it only as these requests, on control slots.

    After a reload, each connected node is told every revoked name (``POST
    /v1/revocations/<name>``: it ends that identity's work and refuses its requests from
    then on, a head the router forwarded before the reload included) and every added name
    (``DELETE``: a name revoked before and listed again is served again).

    A node that was not connected then (its tunnel down, reconnecting, or the router
    restarted with a changed file) would run the revoked identity's work on, which nobody
    can reach any longer: a leaked token's programs. So whenever a node connects, the
    router asks it which identities have work there and which it refuses (``GET
    /v1/revocations``), revokes each of those the router no longer serves and re-admits
    each refused one it serves. The node's own account is asked rather than a log of
    revocations replayed: only it survives a router restart, and no record of which node
    heard what is needed. Names match by identity, as everywhere (a name removed and listed
    again keeps its work). Only a router with a token file does this: without one nothing
    can be revoked. The messages to one node go one at a time, in order, so that a
    re-admission is never overtaken by an older revocation.
    """

    def __init__(self, state: RouterState) -> None:
        self.state = state
        self._order: dict[str, asyncio.Lock] = {}  # node id -> its messages, in order
        #: node id -> the server instance brought up to date since the node connected
        self._synced: dict[str, str] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def served(self) -> set[str]:
        """The identity names the router serves now."""
        return set(self.state.authenticator.identities()) or {EVERYONE}

    def reloaded(self, revoked: list[str], added: list[str]) -> None:
        """A reload revoked and added these names: tell every node that can be reached
        (``NodeRecord.reachable``: also one whose supervisor alone has gone, whose server
        still runs that identity's jobs)."""
        if revoked or added:
            self._start(self._tell_connected(revoked, added))

    def check_nodes(self) -> None:
        """Registry change: bring each node that (re)connected up to date, once per
        connection and server instance."""
        if self.state.settings.auth_token_file is None:
            return
        nodes = self.state.registry.nodes
        for node_id in [n for n in self._synced if n not in nodes]:  # forgotten (retention)
            del self._synced[node_id]
        for node_id, node in nodes.items():
            if not node.reachable():  # a server whose supervisor alone went still runs jobs
                self._synced.pop(node_id, None)
            elif (
                node.server_instance_id
                and self._synced.get(node_id) != node.server_instance_id
                and node.current_slots(CONTROL)
            ):
                self._synced[node_id] = node.server_instance_id
                self._start(self._catch_up(node_id))

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work)
        except RuntimeError:  # no loop: a registry driven by hand (unit tests)
            work.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tell_connected(self, revoked: list[str], added: list[str]) -> None:
        nodes = [node_id for node_id, node in self.state.registry.nodes.items() if node.reachable()]
        told = await asyncio.gather(*(self._tell(node_id, revoked, added) for node_id in nodes))
        for name in revoked:
            unreached = [node for node, names in zip(nodes, told, strict=True) if name not in names]
            self.state.log.event(
                "identity_revoked",
                level="WARNING",
                identity=name,
                nodes=len(nodes) - len(unreached),
                unreached=unreached or None,
            )

    async def _tell(self, node_id: str, revoked: list[str], added: list[str]) -> set[str]:
        """The revoked names ``node_id`` heard; one it missed is caught up with later."""
        heard: set[str] = set()
        async with self._order.setdefault(node_id, asyncio.Lock()):
            for name in revoked:
                if await self._send(node_id, "POST", name):
                    heard.add(name)
            ok = all([await self._send(node_id, "DELETE", name) for name in added])
        if len(heard) < len(revoked) or not ok:
            self._synced.pop(node_id, None)  # asked again at its next status
        return heard

    async def _catch_up(self, node_id: str) -> None:
        """What ``node_id``, just connected, missed. Not tried again when it fails (a node
        from before ``GET /v1/revocations`` drops the slot for that path): the next
        connection, or a reload's message the node misses, tries again."""
        async with self._order.setdefault(node_id, asyncio.Lock()):
            answer = await fetch(self.state, node_id, "GET", "/v1/revocations", [])
            if answer is None:
                return
            working, refused = _names(answer)
            served = self.served()
            for name in sorted(working - served):
                ok = await self._send(node_id, "POST", name)
                self.state.log.event(
                    "identity_revoked",
                    level="WARNING",
                    identity=name,
                    nodes=int(ok),
                    unreached=None if ok else [node_id],
                    on_reconnect=True,
                )
            for name in sorted(refused & served):
                await self._send(node_id, "DELETE", name)

    async def _send(self, node_id: str, method: str, name: str) -> bool:
        answer = await fetch(self.state, node_id, method, f"/v1/revocations/{name}", [])
        return answer is not None and answer[0] == 200


def _names(answer: tuple[int, bytes]) -> tuple[set[str], set[str]]:
    """``(working, revoked)`` from a node's ``GET /v1/revocations``; nothing from a node
    without it (a published server answers 404)."""
    status, body = answer
    found = untrusted_json(body) if status == 200 else None  # a node-token holder wrote it
    if not isinstance(found, dict):
        return set(), set()
    return _strings(found.get("working")), _strings(found.get("revoked"))


def _strings(value: object) -> set[str]:
    """The identity names in ``value`` (what a path can carry; anything else is dropped)."""
    if not isinstance(value, list):
        return set()
    return {v for v in value if isinstance(v, str) and valid_identity_name(v)}


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
