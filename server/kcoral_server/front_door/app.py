"""The Tornado application and the state its handlers share.

``create_app(config)`` builds the application without starting anything; worker processes
start when it starts serving (``listen`` or ``await app.start()``), as CLIENT_API §1.1 asks.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import tornado.web

from kcoral_server.execution.responses import SHUTTING_DOWN
from kcoral_server.front_door.browser_guard import BrowserGuard
from kcoral_server.front_door.callers import IDENTITY_HEADER, Authenticator, Identity, parse_tokens
from kcoral_server.front_door.inflight_bytes import InflightBytes
from kcoral_server.front_door.recent_leases import RecentLeases
from kcoral_server.front_door.token_file import ClientTokens
from kcoral_server.gpu.lease import LeaseArbiter
from kcoral_server.jobs.job_slots import JobSlots
from kcoral_server.jobs.store import JobRegistry
from kcoral_server.metrics.server_metrics import ServerMetrics
from kcoral_server.pool.pool import Pool
from kcoral_server.pool.seat import GpuDevice
from kcoral_server.processes.credentials import credentials_kept, kept_message
from kcoral_server.sessions.registry import Sessions
from kcoral_server.settings.config import ServerConfig, clamped_defaults
from kcoral_server.storage.disk_cache import DiskCache
from kcoral_server.storage.disk_cache import start_problem as disk_cache_start_problem
from kcoral_server.storage.event_log import EventLog
from kcoral_server.storage.memory_cache import MemoryCache

if TYPE_CHECKING:
    from kcoral_server.execution.pipeline import ExecuteRequest

EXECUTOR_THREADS = 4


class ServerState:
    """Configuration, pool, leases, caches, event log and counters of one server process."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        mode: str,
        gpus: Sequence[GpuDevice] = (),
        events: EventLog | None = None,
        sandbox: str = "none",
        auth_token: str | None = None,
        router_secret: str | None = None,
        listen_host: str = "127.0.0.1",
    ) -> None:
        self.config = config
        self.mode = mode  # "cpu", "gpu" or "fake-gpu"
        self.gpus = list(gpus)
        self.gpu_ids = [g.id for g in self.gpus]
        self.sandbox = sandbox
        self.auth_token = auth_token  # the token file's text (one token, or identity lines)
        self.authenticator = Authenticator(
            parse_tokens(auth_token) if auth_token is not None else None, router_secret
        )
        # EXTENSIONS §6: web pages are refused before authentication, on every endpoint.
        self.browser_guard = BrowserGuard.build(
            config.allowed_origins,
            config.allowed_hosts,
            listen_host,
            token_required=not self.authenticator.open,
        )
        self.instance_id = str(uuid.uuid4())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.started_at = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.events = events or EventLog(
            config.log_dir,
            console=config.log_console,
            log_programs=config.log_programs,
            log_programs_max_bytes=config.log_programs_max_bytes,
            log_events_max_bytes=config.log_events_max_bytes,
        )
        self.executor = ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="kcoral")
        self.memory_cache = MemoryCache(config.cache_capacity_bytes)
        self.disk_cache = DiskCache(config.disk_cache_dir, config.disk_cache_capacity_mbytes)
        problem = disk_cache_start_problem(self.disk_cache)
        if problem is not None:
            self.events.emit(problem[0], "WARNING", message=problem[1])
        for message in clamped_defaults(config):
            self.events.emit("setting_clamped", "WARNING", message=message)
        self.arbiter = LeaseArbiter(self.gpu_ids) if mode != "cpu" else None
        self.pool = Pool(
            mode=mode,
            gpus=self.gpus,
            config=config,
            events=self.events,
            arbiter=self.arbiter,
            sandbox=sandbox,
            allowed_serialization=config.allowed_serialization,
        )
        self.jobs = JobRegistry(
            config.job_retention_seconds, config.job_retention_bytes, emit=self.events.emit
        )
        # jobs queued or running at once, shared fairly between identities (EXTENSIONS §5)
        self.job_slots = JobSlots(config.max_queued_jobs, self.authenticator.identity_count)
        self.sessions = Sessions(self)  # EXTENSIONS §11
        self.metrics = ServerMetrics(self.gpu_ids)  # EXTENSIONS §13, its own registry
        self.metrics.attach(self)
        # what a node's supervisor reports of its recent programs (PROTOCOL §13, ROUTER §6)
        self.recent_leases = RecentLeases()
        self.events.add_listener(self.recent_leases.record)
        # What a selector is matched against (EXTENSIONS §14; front_door.node_fit), found
        # once: at start, or by the first request with a selector.
        self.offers: dict[str, str] | None = None
        self.inflight = InflightBytes()  # bodies held, in all and by identity (EXTENSIONS §6)
        #: identity name -> its job event streams open now (at most MAX_STREAMS_PER_IDENTITY)
        self.open_streams: Counter[str] = Counter()
        #: every request between its start and its answer (a revoked token's are cancelled)
        self.live_requests: set[ExecuteRequest] = set()
        #: identity name -> when it was last revoked (monotonic): a request whose body was
        #: still arriving then is refused once it has come (front_door.token_reload)
        self.revoked_at: dict[str, float] = {}
        #: a node's server: the names its router revoked and has not admitted again; their
        #: requests are refused, even one the router checked before it revoked the name
        #: (its head may come after the revocation, on another slot; front_door.token_reload)
        self.router_revoked: set[str] = set()
        self.open_requests = 0  # /execute handlers that have not written their reply yet
        self.finished_requests = 0
        self.shutting_down = False
        self.started: asyncio.Future[None] | None = None
        self._request_done = asyncio.Event()

    # ------------------------------------------------------------------ helpers

    @property
    def device(self) -> str:
        """``cpu`` or ``gpu`` as clients see it (fake GPUs behave like GPUs)."""
        return "cpu" if self.mode == "cpu" else "gpu"

    @property
    def gpu_count(self) -> int:
        return 0 if self.mode == "cpu" else len(self.gpu_ids)

    def refusing(self) -> str | None:
        """Why no new program or session is admitted now (a 503's why, PROTOCOL §7.1: a
        shutdown, or a pool that admits nothing until restarted), or None."""
        if self.shutting_down:
            return SHUTTING_DOWN
        return None if self.pool.accepting else self.pool.refusing or SHUTTING_DOWN

    def gpu_uuid(self, gpu_id: int) -> str:
        device = next((g for g in self.gpus if g.id == gpu_id), None)
        return device.uuid if device else ""

    def authenticate(self, headers: Mapping[str, str]) -> Identity | None:
        """The caller's identity from its bearer token; None means 401 (EXTENSIONS §6)."""
        return self.authenticator.authenticate(
            headers.get("Authorization"), headers.get(IDENTITY_HEADER)
        )

    def use_tokens(self, read: ClientTokens) -> None:
        """Serve the client tokens of a token file read anew from now on (SIGHUP,
        ``front_door.token_reload``); the per-identity shares follow the new count."""
        self.auth_token = read.text
        self.authenticator = Authenticator(read.tokens)
        count = self.authenticator.identity_count
        self.job_slots.use_identity_count(count)
        self.sessions.use_identity_count(count)
        kept = credentials_kept(os.environ, self.config, count)
        if kept:  # decided at start (processes/credentials.py): say what a restart changes
            self.events.emit("worker_env_kept", "WARNING", names=kept, message=kept_message(kept))

    def request_done(self) -> None:
        self.finished_requests += 1
        self._request_done.set()

    def reply_sent(self) -> None:
        """An /execute reply went out (wakes a draining shutdown)."""
        self._request_done.set()

    async def wait_request_done(self) -> None:
        await self._request_done.wait()
        self._request_done.clear()

    def health(self) -> dict[str, Any]:
        pool = self.pool
        return {
            # "ok" while draining too: PROTOCOL §12 answers 200 whenever the server can
            # answer; request_capacity 0 says it takes nothing new (SERVER §12)
            "status": "ok",
            "instance_id": self.instance_id,
            "started_at": self.started_at,
            "gpu_count": self.gpu_count,
            "load": {
                "request_capacity": 0 if self.shutting_down else pool.request_capacity,
                "requests_in_progress": pool.requests_in_progress,
                "requests_waiting": pool.requests_waiting,
            },
            "target": dict(pool.target),
            "versions": dict(pool.versions),
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the worker pool once (later calls wait for the first)."""
        if self.started is None:
            self.started = asyncio.ensure_future(self._start())
        await asyncio.shield(self.started)

    async def _start(self) -> None:
        from kcoral_server.front_door.node_fit import describe_offers

        self.jobs.attach(self.pool)
        if self.offers is None:  # a GPU probe (NVML or nvidia-smi): off the loop
            offers = await asyncio.get_running_loop().run_in_executor(
                self.executor, describe_offers, self
            )
            self.offers = self.offers or offers
        await self.pool.start()
        self.events.emit(
            "pool_ready",
            sandbox=self.sandbox,
            mode=self.device,
            target=self.pool.target,
            versions=self.pool.versions,
            workers=len(self.pool.seats),
        )

    async def stop(self) -> None:
        self.shutting_down = True
        self.jobs.close()
        await self.sessions.close()
        await self.pool.close(timeout=float(self.config.worker_termination_grace_seconds) + 5)
        self.executor.shutdown(wait=False)


#: Answers to who is asking (a token, a browser's Origin or Host): their access lines stay
#: with ``--no-log-console`` (SERVER §13).
REFUSED_CALLER = frozenset({401, 403})


class KCoralApplication(tornado.web.Application):
    """A Tornado application that starts its worker pool when it starts serving."""

    def __init__(self, state: ServerState, handlers: list, **settings: Any) -> None:
        super().__init__(handlers, **settings)
        self.state = state

    def log_request(self, handler: tornado.web.RequestHandler) -> None:
        """Tornado's access log, and the request's duration for ``/metrics``."""
        from kcoral_server.front_door.handlers import METRIC_ENDPOINTS

        # Its lines (an answer of 400 or above) go to stderr: --no-log-console silences them
        # with the console mirror, but for 401 and 403: a wrong token or a foreign page
        # refused before any event has no other trace, and a refused caller is the one
        # line an operator must be able to find.
        if self.state.config.log_console or handler.get_status() in REFUSED_CALLER:
            super().log_request(handler)
        self.state.metrics.observe_request(
            METRIC_ENDPOINTS.get(type(handler)), handler.request.request_time()
        )

    def listen(self, port: int, address: str | None = None, **kwargs: Any) -> Any:
        kwargs.setdefault("max_body_size", self.state.config.max_request_bytes + (1 << 20))
        server = super().listen(port, address or "", **kwargs)
        asyncio.get_event_loop().create_task(self.start())
        return server

    async def start(self) -> None:
        await self.state.start()

    async def stop(self) -> None:
        await self.state.stop()


def create_app(
    config: ServerConfig | None = None,
    *,
    mode: str | None = None,
    gpus: Sequence[GpuDevice] | None = None,
    events: EventLog | None = None,
    sandbox: str | None = None,
    auth_token: str | None = None,
    listen_host: str = "127.0.0.1",
    router_secret: str | None = None,
) -> KCoralApplication:
    """Build the application for ``config`` (default ``ServerConfig()``); starts nothing.

    ``mode``/``gpus`` come from device resolution (``kcoral server`` probes for them); when
    omitted they follow ``config.device`` without probing (``auto`` means CPU here unless a
    fake GPU count is configured). ``listen_host`` is the address the caller listens on: a
    token-less server accepts it in ``Host`` besides loopback names (EXTENSIONS §6).
    """
    from kcoral_server.front_door.handlers import routes
    from kcoral_server.front_door.handlers.base import NotFoundHandler

    config = config if config is not None else ServerConfig()
    config.validate()
    if mode is None:
        mode, gpus = default_devices(config)
    state = ServerState(
        config,
        mode=mode,
        gpus=gpus or [],
        events=events,
        sandbox=sandbox if sandbox is not None else "none",
        auth_token=auth_token if auth_token is not None else config.read_auth_token(),
        listen_host=listen_host,
        # A node's child (ROUTER §12): only its tunnel, which holds this secret, is served.
        router_secret=router_secret,
    )
    # Paths no route matches are ours too: their body is never read (handlers.base).
    return KCoralApplication(
        state,
        routes(state),
        default_handler_class=NotFoundHandler,
        default_handler_args={"state": state},
    )


def default_devices(config: ServerConfig) -> tuple[str, list[GpuDevice]]:
    """Device mode without a CUDA probe: fake GPUs when configured, CPU for ``auto``."""
    if config.device == "fake-gpu" or config.fake_gpu_count:
        count = config.fake_gpu_count or len(config.gpus)
        ids = list(config.gpus[:count]) if len(config.gpus) >= count else list(range(count))
        return "fake-gpu", [GpuDevice(i, "", "sm_90a") for i in ids]
    if config.device == "gpu":
        return "gpu", [GpuDevice(i) for i in dict.fromkeys(config.gpus)]
    return "cpu", []
