"""What ends a ``kcoral run`` once its program is on its way (CLIENT_API §11, EXTENSIONS
§7): the server lost the job, the connection or the token changed under it, or ``--gpus``
met a server without GPUs, each said in one line of what happened and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: How long the server lets a job of ``kcoral run`` run on with no client following its
#: events: longer than the client's reconnects after a restarted router or a network blip
#: (EXTENSIONS §5; ``kcoral.jobs`` gives up after ~10 s of refused connections, or 45 s of
#: a router's 503), so only a client that is gone loses its job.
UNFOLLOWED_CANCEL_SECONDS = 60


#: how a router's 404 for a job whose node restarted its server begins (ROUTER §13): that
#: message names the cause, where "was it restarted?" only guessed it
LOST_JOB = "job lost: "


class JobLost(Exception):
    """The server answered 404 for the job it had accepted: it restarted (jobs live in its
    memory; "HTTP 404: job not found" told the user nothing), or it dropped the finished
    job before its result was fetched (kind ``job_expired``, whose message says why)."""

    def __init__(self, expired: str | None, lost: str | None = None) -> None:
        super().__init__(expired)
        self.expired = expired
        self.lost = lost  # a router's "job lost: its node ... restarted its server, ..."

    def __str__(self) -> str:
        if self.lost is not None:
            return f"{self.lost}; the remote tool's result is lost"
        if self.expired is not None:
            return f"the server dropped this run's result before it was fetched ({self.expired})"
        return (
            "the server no longer has this run's job (was it restarted?); "
            "the remote tool's result is lost"
        )


class GpusOnACpuServer(Exception):
    """``--gpus`` for a server that runs programs on the CPU (``/v1/info`` ``device``): its
    400 read "gpu_count exceeds this GPU server's configured capacity" (PROTOCOL §7's fixed
    message), as if it were a GPU server with too few."""

    def __init__(self, gpu_count: int, gpu_kinds: Sequence[str] = ()) -> None:
        super().__init__(gpu_count)
        self.gpu_count = gpu_count
        #: a router's GPU kinds (``/v1/info`` ``fleet``), which ``--select`` reaches: "has
        #: no GPUs" was false of a mixed fleet whose default kind is a CPU one
        self.gpu_kinds = list(gpu_kinds)

    def __str__(self) -> str:
        if self.gpu_kinds:
            choices = " or ".join(f"--select gpu={kind}" for kind in self.gpu_kinds)
            return (
                f"--gpus {self.gpu_count}: this router's default nodes run programs on the "
                f"CPU; its GPU nodes take {choices}"
            )
        return (
            f"--gpus {self.gpu_count}: this server runs programs on the CPU and has no GPUs; "
            "leave --gpus out, or give a GPU server's --url"
        )


class GpusBeyondTheServer(Exception):
    """``--gpus N`` for a GPU server with fewer: its 400 read "server error: HTTP 400:
    gpu_count exceeds this GPU server's configured capacity" (PROTOCOL §7), which left the
    user to find how many it has. ``gpus`` is its ``/health`` (``2 GPUs (sm_90a)``), asked
    only after the refusal."""

    def __init__(self, gpu_count: int, url: str, gpus: str) -> None:
        super().__init__(gpu_count)
        self.gpu_count = gpu_count
        self.url = url
        self.gpus = gpus

    def __str__(self) -> str:
        return (
            f"--gpus {self.gpu_count}: the server at {self.url} has {self.gpus}; "
            "ask for no more, or give a bigger server's --url"
        )


class ConnectionLostMidRun(Exception):
    """The server stopped answering once it had accepted the job and reconnecting failed.
    The job may run on (a network outage, a proxy restarted): "cannot reach the server"
    alone read as if nothing had been started and gave no job to follow or cancel."""

    def __init__(self, job_id: str, url: str, reason: str, cancelled: bool = True) -> None:
        super().__init__(job_id)
        self.job_id = job_id
        self.url = url
        self.reason = reason
        self.cancelled = cancelled  # the server ends a job nobody follows

    def __str__(self) -> str:
        return (
            f"lost the server at {self.url} while the tool ran: {self.reason}; its job "
            f"{self.job_id} may run on{unfollowed_clause(self.cancelled)}: follow or cancel "
            f"it with kcoral.Client({self.url!r}).job({self.job_id!r})"
        )


class TokenRefusedMidRun(Exception):
    """The server answered 401 for the job it had accepted with this token: an operator
    rotated or revoked it (``SIGHUP``, EXTENSIONS §6). A rotated token's job runs on, which
    "HTTP 401: missing or invalid bearer token" alone never said, nor how to follow it; and
    only for ``UNFOLLOWED_CANCEL_SECONDS`` unless followed, which "runs on" alone hid."""

    def __init__(self, job_id: str, url: str, cancelled: bool = True) -> None:
        super().__init__(job_id)
        self.job_id = job_id
        self.url = url
        self.cancelled = cancelled  # the server ends a job nobody follows

    def __str__(self) -> str:
        return (
            "the server stopped accepting this token while the tool ran (rotated or "
            f"revoked?); a rotated token's job {self.job_id} runs on"
            f"{unfollowed_clause(self.cancelled)}: follow it with "
            f"kcoral.Client({self.url!r}).job({self.job_id!r}) and KCORAL_TOKEN set to the "
            "new token"
        )


def unfollowed_clause(cancelled: bool) -> str:
    """How long an abandoned job runs on: until a server that ends unfollowed jobs (feature
    ``cancel-unfollowed``) ends it; nothing is promised of one that does not."""
    if not cancelled:
        return ""
    return f", and is cancelled {UNFOLLOWED_CANCEL_SECONDS} s after its last follower went"


def gpu_kinds(info: dict[str, Any]) -> list[str]:
    """The GPU kinds of a router's fleet (``/v1/info`` ``fleet.kinds`` with GPUs, ROUTER
    §6), printable names only (a server's words reach the terminal); [] for a server."""
    fleet = info.get("fleet")
    kinds = fleet.get("kinds") if isinstance(fleet, dict) else None
    found: list[str] = []
    for kind in kinds if isinstance(kinds, list) else []:
        if not isinstance(kind, dict):
            continue
        name, gpus = kind.get("gpu"), kind.get("gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
            continue
        if isinstance(name, str) and SELECTOR_WORD.fullmatch(name) and name not in found:
            found.append(name)
    return found


#: a kind name fit to be shown and typed back as ``--select gpu=NAME``
SELECTOR_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
