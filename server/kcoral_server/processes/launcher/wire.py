"""What the front-end and its launchers (and spawn supervisors) say to each other.

The control socket carries one JSON datagram each way per fork (``LaunchRequest``,
``LaunchReply``; the descriptors travel beside them as ``SCM_RIGHTS``); a forked worker's
status pipe carries one ``STATUS`` record, written by the launcher once it reaped the worker.
The names here are read on both ends: the front-end in the server process, the fork server
and the spawn supervisor in their own processes (``python -m kcoral_server.processes.launcher``).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

#: the module ``python -m`` runs as the fork server (and, ``--supervise``, as a supervisor)
ENTRY_MODULE = "kcoral_server.processes.launcher"

#: a status pipe's record: exit code (``-signal`` when killed), orphans that survived SIGKILL
STATUS = struct.Struct("<ii")
#: the largest control datagram (the environment travels in one)
MAX_MESSAGE = 1 << 20

#: a worker's exit is reported after this even if an orphan refuses to die (D state)
ORPHAN_KILL_SECONDS = 10.0
#: overrides ``ORPHAN_KILL_SECONDS`` (tests shorten it); read by the front-end and, through
#: the inherited environment, by the launcher and the supervisors
ORPHAN_KILL_ENV = "KCORAL_ORPHAN_KILL_SECONDS"

#: what ``--preload`` may name: modules the launcher imports once idle, when installed
PRELOADABLE = ("torch",)

#: the supervised command (a JSON list); in the environment, not argv, so that process
#: listings show ``kcoral_server.worker`` for the worker only
SUPERVISE_ENV = "KCORAL_SUPERVISE_COMMAND"


def orphan_kill_seconds() -> float:
    """How long orphans may take to die after ``SIGKILL`` before they count as survivors."""
    try:
        value = float(os.environ.get(ORPHAN_KILL_ENV, ORPHAN_KILL_SECONDS))
    except ValueError:
        return ORPHAN_KILL_SECONDS
    return value if value > 0 else ORPHAN_KILL_SECONDS


@dataclass(frozen=True)
class LaunchRequest:
    """Fork a worker: its environment, the ``cgroup.procs`` files it enters itself, and
    whether it then waits for the front-end's go (a sandboxed launcher's child, which the
    front-end moves into its cgroups; a worker forked ahead, SERVER §6). Sent with the
    worker's socket end, and with ``go`` the read end of the go pipe. ``after_preload``:
    no program waits for this worker (a spare), so a launcher whose preload is still to
    come does it first and forks a worker that has torch, instead of one that would import
    it itself at its first program (seconds, for each of a server's first few workers)."""

    env: dict[str, str]
    cgroups: tuple[str, ...] = ()
    go: bool = False
    after_preload: bool = False

    @property
    def descriptors(self) -> int:
        """How many descriptors travel with the request."""
        return 2 if self.go else 1

    def encode(self) -> bytes:
        return json.dumps(
            {
                "env": self.env,
                "cgroups": list(self.cgroups),
                "go": self.go,
                "after_preload": self.after_preload,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> LaunchRequest:
        """Raises ``ValueError``, ``KeyError`` or ``TypeError`` for a malformed request."""
        request = json.loads(data)
        env = request["env"]
        if not isinstance(env, dict):
            raise TypeError("env is not an object")
        cgroups = tuple(str(path) for path in request.get("cgroups", []))
        return cls(
            {str(k): str(v) for k, v in env.items()},
            cgroups,
            bool(request.get("go")),
            bool(request.get("after_preload")),
        )


@dataclass(frozen=True)
class LaunchReply:
    """The launcher's answer: the forked worker's pid (in the launcher's PID namespace) and
    the modules it had preloaded, sent with the read end of the worker's status pipe; or an
    error, ``refused`` when the fork rule forbade the fork (SERVER §1)."""

    pid: int | None = None
    preloaded: tuple[str, ...] = ()
    error: str | None = None
    refused: bool = False

    def encode(self) -> bytes:
        if self.pid is not None:
            return json.dumps({"pid": self.pid, "preloaded": list(self.preloaded)}).encode()
        reply: dict[str, str | bool] = {"error": self.error or "worker launcher failed"}
        if self.refused:
            reply["refused"] = True
        return json.dumps(reply).encode()

    @classmethod
    def decode(cls, data: bytes) -> LaunchReply:
        """Raises ``ValueError`` for a reply that is not JSON."""
        reply = json.loads(data)
        if not isinstance(reply, dict):
            return cls(error="worker launcher failed")
        if "pid" in reply:
            preloaded = tuple(str(name) for name in reply.get("preloaded", ()))
            return cls(pid=int(reply["pid"]), preloaded=preloaded)
        error = str(reply.get("error", "worker launcher failed"))
        return cls(error=error, refused=bool(reply.get("refused")))
