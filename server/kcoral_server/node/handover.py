"""How the node supervisor hands its secrets to its child server (ROUTER §12).

Three secrets cross from supervisor to child: the node token (the child's slot streams present
it to the router), the *router secret*, a random value made fresh for every child start
that the tunnel presents on each request it relays to the child's loopback port, and the
*slot key*, also fresh for every start, which the supervisor announces to the router on its
own stream and the child's slots present in their ``SlotHello``. The child believes
``X-KCoral-Identity`` only from a request carrying the router secret and holds no client
token, so it serves nobody but its own tunnel; the router opens slots for a node only to
the holder of its slot key, so the node token alone does not let another process take a
live node's seats (ROUTER §12).

Who can reach what: a *program* run by the child (a worker) must not learn either secret,
or it could claim the node's id at the router (node token) or talk to its own server as any
identity (router secret). Neither travels on a command line (``/proc/PID/cmdline`` is
world-readable) nor in the child's environment (``/proc/PID/environ`` keeps the initial
environment even after ``os.environ`` forgets a variable, and workers inherit it). They
travel through an inherited pipe: the supervisor writes them and closes its end before the
child starts, the child reads them once at start-up and closes the pipe, before any worker
or launcher exists. Only the pipe's descriptor number is in the environment.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

from kcoral_server.worker.reaper import tie_to_parent

SECRETS_FD_ENV = "KCORAL_NODE_SECRETS_FD"
#: the supervisor's pid, which its child ties its life to (``tie_to_supervisor``)
SUPERVISOR_PID_ENV = "KCORAL_NODE_SUPERVISOR_PID"
#: Environment variables that carry KCoral credentials; never passed on to the child.
CREDENTIAL_VARIABLES = frozenset(
    {"KCORAL_NODE_TOKEN", "KCORAL_AUTH_TOKEN", "KCORAL_TOKEN", "KCORAL_METRICS_TOKEN"}
)
MAX_SECRETS_BYTES = 65536  # fits in a pipe buffer: writing never blocks before the child reads


class HandoverError(RuntimeError):
    """The child was started without readable secrets (e.g. by hand)."""


@dataclass(frozen=True)
class NodeSecrets:
    node_token: str | None = field(default=None, repr=False)
    router_secret: str = field(default="", repr=False)
    slot_key: str = field(default="", repr=False)


def is_credential(name: str) -> bool:
    """A KCoral token or secret variable (``KCORAL_*_TOKEN``, ``KCORAL_*_SECRET``)."""
    return name in CREDENTIAL_VARIABLES or (
        name.startswith("KCORAL_") and name.endswith(("_TOKEN", "_SECRET"))
    )


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without any KCoral credential (the child gets them through the pipe)."""
    return {k: v for k, v in environ.items() if not is_credential(k) and k != SECRETS_FD_ENV}


def write_secrets(secrets: NodeSecrets) -> int:
    """A pipe holding ``secrets``; return its read end (inheritable: pass it to the child).

    The caller closes the returned descriptor once the child has started."""
    payload = json.dumps(
        {
            "node_token": secrets.node_token,
            "router_secret": secrets.router_secret,
            "slot_key": secrets.slot_key,
        }
    ).encode()
    if len(payload) > MAX_SECRETS_BYTES:
        raise ValueError("node secrets are too large")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, payload)
    finally:
        os.close(write_end)
    return read_end


def read_secrets(environ: MutableMapping[str, str]) -> NodeSecrets:
    """Read and close the pipe named by ``KCORAL_NODE_SECRETS_FD`` (removed from ``environ``)."""
    raw = environ.pop(SECRETS_FD_ENV, None)
    if raw is None or not raw.isdigit():
        raise HandoverError(
            "--node-child is started by the node supervisor only (no secrets were handed over)"
        )
    fd = int(raw)
    chunks: list[bytes] = []
    try:
        while sum(map(len, chunks)) <= MAX_SECRETS_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as exc:
        raise HandoverError(f"cannot read the node secrets: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        document = json.loads(b"".join(chunks))
        token, secret = document["node_token"], document["router_secret"]
        slot_key = document.get("slot_key", "")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HandoverError("the node secrets are malformed") from None
    if (
        (token is not None and not isinstance(token, str))
        or not isinstance(secret, str)
        or not isinstance(slot_key, str)
    ):
        raise HandoverError("the node secrets are malformed")
    if not secret:
        raise HandoverError("the node secrets hold no router secret")
    return NodeSecrets(node_token=token or None, router_secret=secret, slot_key=slot_key)


def tie_to_supervisor(environ: MutableMapping[str, str]) -> bool:
    """Have this child get SIGTERM when its supervisor (``KCORAL_NODE_SUPERVISOR_PID``,
    removed from ``environ``) dies, SIGKILL included: it then drains and exits as on a
    supervisor's stop (ROUTER §12). Before, a child whose supervisor was killed lived on
    with its port, workers and slots, and the restarted supervisor's child could not listen
    (``Address already in use``) until someone killed the orphan by hand. False when the
    supervisor is gone already (the caller exits); True without the variable."""
    raw = environ.pop(SUPERVISOR_PID_ENV, "")
    if not raw.isdigit():
        return True
    return tie_to_parent(int(raw), signal.SIGTERM)
