"""What the running request is, for server-side code running inside the worker.

Set by the engine for the duration of a program; ``None`` between programs. Server helpers
(e.g. the remote-function call trampoline, which must refuse to unpickle unless the request
was admitted with ``pickle``) read it instead of receiving it through uploaded code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestContext:
    request_id: str
    device: str  # "cpu", "gpu" or "fake-gpu"
    workspace: str
    serialization: str | None  # the format the request was admitted with, if any
    allowed_serialization: tuple[str, ...]


current: RequestContext | None = None


def current_request() -> RequestContext | None:
    """The request being executed by this worker, or None outside a program."""
    return current
