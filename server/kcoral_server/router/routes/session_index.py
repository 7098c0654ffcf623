"""Which node holds which session, and for whom (EXTENSIONS §11, ROUTER §13): the router learns it
from 201 answers, merged lists and look-ups (bounded), and ends a session for good once its
node leaves or runs a new server; and what it does for a node that comes back still holding
sessions it ended."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kcoral_server.front_door.callers import Identity
from kcoral_server.router.forwarding.headers import identity_header
from kcoral_server.router.routes.fan_out import (
    fetch,
)


@dataclass
class RoutedSession:
    """Where one session lives, as the router knows it."""

    node_id: str
    instance_id: str  # the node's server instance that holds the session's worker
    owner: str
    ended: str | None = None  # the 410 message once the router knows its state is lost
    released: bool = False  # its node came back and was asked to end it

    def lose(self, why: str) -> None:
        """The session's state is gone (``why``: what happened to its node)."""
        if self.ended is None:
            self.ended = f"session ended: its node {self.node_id} {why}; its state is lost"


class SessionIndex:
    """Session id → node, learned from 201 answers, merged lists and look-ups (bounded),
    and which nodes offer sessions (from their ``/v1/info``)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._sessions: OrderedDict[str, RoutedSession] = OrderedDict()
        self.offering: set[str] = set()

    def remember(self, session_id: str, node_id: str, instance_id: str, owner: str) -> bool:
        """Bind ``session_id`` to ``node_id``; False when another node holds it already.

        A rogue node (one with a node token) that claims another node's session, in a list
        or a look-up, must not have its programs and its owner's identity sent to it: a
        live binding is never moved to another node."""
        known = self._sessions.get(session_id)
        if known is not None and known.ended is not None:
            return True  # a lost session stays lost (its node may answer again, its state is gone)
        if known is not None and known.node_id != node_id:
            return False
        self._sessions[session_id] = RoutedSession(node_id, instance_id, owner)
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.capacity:
            self._sessions.popitem(last=False)
        return True

    def get(self, session_id: str) -> RoutedSession | None:
        return self._sessions.get(session_id)

    def node_lost(self, node_id: str, why: str) -> None:
        """Every live session of ``node_id`` ends for the router (``why``: what happened)."""
        self.offering.discard(node_id)
        for session in self._sessions.values():
            if session.node_id == node_id:
                session.lose(why)

    def server_lost(self, node_id: str, instance_id: str) -> None:
        """``node_id``'s server ``instance_id`` is gone (every slot it held closed while a
        program ran): its sessions end for the router."""
        for session in self._sessions.values():
            if session.node_id == node_id and session.instance_id == instance_id:
                session.lose("lost its server while a program of the session ran")

    def server_restarted(self, node_id: str, instance_id: str) -> None:
        """The sessions of ``node_id``'s servers before ``instance_id``, its current one,
        end for the router; those its current server made live on."""
        for session in self._sessions.values():
            if session.node_id == node_id and session.instance_id != instance_id:
                session.lose("restarted its server")

    def orphans(self, node_id: str, instance_id: str) -> list[tuple[str, RoutedSession]]:
        """Sessions the router ended when ``node_id`` left that its server (``instance_id``,
        the same as before) may still hold: each is returned once."""
        found = []
        for session_id, session in self._sessions.items():
            if (
                session.node_id == node_id
                and session.instance_id == instance_id
                and session.ended is not None
                and not session.released
            ):
                session.released = True
                found.append((session_id, session))
        return found

    def __len__(self) -> int:
        return len(self._sessions)


async def release_orphans(state: Any, node_id: str) -> None:
    """A lost node came back with the same server: it still holds the sessions the router
    ended when it left (they answer 410 here for good), so each is deleted there in its
    owner's name and its seat is free again instead of waiting for its idle timeout."""
    node = state.registry.nodes.get(node_id)
    if node is None:
        return
    for session_id, session in state.sessions.orphans(node_id, node.server_instance_id):
        header = identity_header(Identity(session.owner))
        path = f"/v1/sessions/{session_id}"
        await fetch(state, node_id, "DELETE", path, [(header.name, header.value)])


def node_back_handler(state: Any) -> Callable[[str], None]:
    """``Registry.on_node_back`` for ``state``: release the node's orphans in the background."""
    tasks: set[asyncio.Task[None]] = set()

    def node_back(node_id: str) -> None:
        task = asyncio.ensure_future(release_orphans(state, node_id))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return node_back
