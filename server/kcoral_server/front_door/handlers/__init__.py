"""HTTP handlers: ``/execute``, ``/v1/jobs``, ``/health``, ``/internal/worker-status``,
``/v1/info``, ``/v1/sessions``, ``/metrics``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kcoral_server.front_door.handlers.base import NotFoundHandler
from kcoral_server.front_door.handlers.execute import ExecuteHandler
from kcoral_server.front_door.handlers.jobs import (
    JOB_ID_PATTERN,
    JobEventsHandler,
    JobResultHandler,
    JobStateHandler,
    JobSubmitHandler,
)
from kcoral_server.front_door.handlers.metrics import MetricsHandler
from kcoral_server.front_door.handlers.revocations import (
    NAME_PATTERN,
    RevocationHandler,
    RevocationsHandler,
)
from kcoral_server.front_door.handlers.sessions import (
    SESSION_ID_PATTERN,
    SessionExecuteHandler,
    SessionHandler,
    SessionInterruptHandler,
    SessionJobHandler,
    SessionsHandler,
)
from kcoral_server.front_door.handlers.status import HealthHandler, InfoHandler, WorkerStatusHandler

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState


def routes(state: ServerState) -> list[tuple[str, type, dict[str, Any]]]:
    """URL table of the server (unknown paths fall through to a JSON 404)."""
    args = {"state": state}
    # A node's server: its router ends the work of the identities it revoked (no tokens here).
    revocations = (
        [
            (r"/v1/revocations", RevocationsHandler, args),
            (rf"/v1/revocations/{NAME_PATTERN}", RevocationHandler, args),
        ]
        if state.authenticator.tunnel_only
        else []
    )
    return [
        *revocations,
        (r"/execute", ExecuteHandler, args),
        (r"/v1/jobs", JobSubmitHandler, args),
        (rf"/v1/jobs/{JOB_ID_PATTERN}", JobStateHandler, args),
        (rf"/v1/jobs/{JOB_ID_PATTERN}/events", JobEventsHandler, args),
        (rf"/v1/jobs/{JOB_ID_PATTERN}/result", JobResultHandler, args),
        (r"/v1/sessions", SessionsHandler, args),
        (rf"/v1/sessions/{SESSION_ID_PATTERN}", SessionHandler, args),
        (rf"/v1/sessions/{SESSION_ID_PATTERN}/execute", SessionExecuteHandler, args),
        (rf"/v1/sessions/{SESSION_ID_PATTERN}/interrupt", SessionInterruptHandler, args),
        (rf"/v1/sessions/{SESSION_ID_PATTERN}/jobs", SessionJobHandler, args),
        (r"/health", HealthHandler, args),
        (r"/internal/worker-status", WorkerStatusHandler, args),
        (r"/v1/info", InfoHandler, args),
        (r"/metrics", MetricsHandler, args),
        (r".*", NotFoundHandler, args),
    ]


#: the endpoint each handler's request durations are counted under (``kcoral_server.metrics``)
METRIC_ENDPOINTS: dict[type, str] = {
    ExecuteHandler: "execute",
    JobSubmitHandler: "jobs",
    JobStateHandler: "jobs",
    JobEventsHandler: "jobs",
    JobResultHandler: "jobs",
    SessionsHandler: "sessions",
    SessionHandler: "sessions",
    SessionExecuteHandler: "sessions",
    SessionInterruptHandler: "sessions",
    SessionJobHandler: "sessions",
    HealthHandler: "health",
    InfoHandler: "info",
    WorkerStatusHandler: "worker_status",
    MetricsHandler: "metrics",
}
