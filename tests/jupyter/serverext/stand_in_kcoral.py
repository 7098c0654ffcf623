"""What the server-extension tests with stand-in KCoral servers share: a healthy ``/health``
answer, the Jupyter configuration that lists the stand-ins, and a KCoral server that
records every call the extension makes to it."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from stand_in_http import StandIn
from traitlets.config import Config

HEALTH = {
    "status": "ok",
    "gpu_count": 0,
    "load": {"request_capacity": 1, "requests_in_progress": 0, "requests_waiting": 0},
    "target": {},
    "versions": {},
}


def extension_config(servers: list[dict[str, Any]], request_timeout: float = 20.0) -> Config:
    """A Jupyter server with the KCoral extension, configured with ``servers``."""
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {"request_timeout": request_timeout, "servers": servers},
        }
    )


class RecordingKCoralServer(StandIn):
    """The user's KCoral server: answers like one without jobs, records every call."""

    calls: ClassVar[list[str]] = []
    lock = threading.Lock()

    def _answer(self) -> None:
        with self.lock:
            self.calls.append(f"{self.command} {self.path}")
        self.send_json({"error": {"kind": "not_found", "message": "no such job"}}, 404)

    do_GET = do_DELETE = do_POST = _answer
