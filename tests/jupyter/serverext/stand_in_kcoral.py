"""What the server-extension tests with stand-in KCoral servers share: a healthy ``/health``
answer and the Jupyter configuration that lists the stand-ins."""

from __future__ import annotations

from typing import Any

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
