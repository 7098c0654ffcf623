"""Which node holds which session, and for whom (EXTENSIONS §11, ROUTER §13): the router learns it
from 201 answers, merged lists and look-ups (bounded), and ends a session for good once its
node leaves or runs a new server; what it does for a node that comes back still holding
sessions it ended; and, in its first seconds, what each node that connects lists (so a
session whose node restarted since is known gone) and the ends asked for meanwhile."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kcoral_server.front_door.callers import Identity
from kcoral_server.router.forwarding.headers import identity_header
from kcoral_server.router.nodes.slot import CONTROL
from kcoral_server.router.routes.fan_out import fetch, untrusted_json
from kcoral_server.router.routes.session_listings import Listing, ListingTable

SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: whom the router names itself to a node when it lists that node's sessions: an admin
#: identity sees every identity's (EXTENSIONS §11)
LISTER = Identity("kcoral-router", admin=True)


#: the identities whose ends of one session id are kept (the owner, an admin, strangers)
MAX_CLOSERS = 4
#: the ends of sessions one identity may have kept at once (a user's kernels and scripts
#: that exit while the router restarts are a few; a flood of made-up ids is not kept)
MAX_KEPT_ENDS = 1024
#: a supervisor's longest reconnect back-off (ROUTER §4.5): a node that lived through the
#: router's grace has reconnected, and listed its sessions, by this long after it
LONGEST_RECONNECT_SECONDS = 30.0


@dataclass
class RoutedSession:
    """Where one session lives, as the router knows it."""

    node_id: str
    instance_id: str  # the node's server instance that holds the session's worker
    owner: str
    ended: str | None = None  # the 410 message once the router knows its state is lost
    released: bool = False  # its node came back and was asked to end it
    # bound from its owner's own create (the node's 201 to that caller), not from a node's
    # claim (a list or a look-up): only a claim can be a rogue's word against another node's
    created: bool = False

    def lose(self, why: str) -> None:
        """The session's state is gone (``why``: what happened to its node)."""
        if self.ended is None:
            self.ended = f"session ended: its node {self.node_id} {why}; its state is lost"


def _bounded_put(table: OrderedDict[str, Any], key: str, value: Any, capacity: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > capacity:
        table.popitem(last=False)


class SessionIndex:
    """Session id → node, learned from 201 answers, merged lists and look-ups (bounded),
    and which nodes offer sessions (from their ``/v1/info``)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._sessions: OrderedDict[str, RoutedSession] = OrderedDict()
        self.offering: set[str] = set()
        # What nodes listed as they connected (each node its share), and the ends asked
        # for by whom while no node knew the id.
        self.listings = ListingTable(capacity)
        self._closing: OrderedDict[str, dict[Identity, None]] = OrderedDict()
        self._kept_ends: Counter[Identity] = Counter()  # how many ends each keeps there
        # the ends carried out, in whose name: sent again to another node that lists the id
        self._carried: OrderedDict[str, Identity] = OrderedDict()

    def remember(
        self, session_id: str, node_id: str, instance_id: str, owner: str, created: bool = False
    ) -> bool:
        """Bind ``session_id`` to ``node_id`` (``created``: from its owner's create); False
        when another node holds it already.

        A rogue node (one with a node token) that claims another node's session, in a list
        or a look-up, must not have its programs and its owner's identity sent to it: a
        live binding is not moved to another node here (only ``rebind`` moves a claim)."""
        known = self._sessions.get(session_id)
        if known is not None and known.ended is not None:
            return True  # a lost session stays lost (its node may answer again, its state is gone)
        if known is not None and known.node_id != node_id:
            return False
        created = created or (known is not None and known.created)
        self._sessions[session_id] = RoutedSession(node_id, instance_id, owner, created=created)
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.capacity:
            self._sessions.popitem(last=False)
        return True

    def get(self, session_id: str) -> RoutedSession | None:
        return self._sessions.get(session_id)

    def rebind(self, session_id: str, node_id: str, instance_id: str, owner: str) -> None:
        """Move a claimed binding of ``session_id`` (``SessionInventory.disputed``) to
        ``node_id``, the one node the evidence names (``SessionInventory.believed``)."""
        self._sessions.pop(session_id, None)
        self.remember(session_id, node_id, instance_id, owner)

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

    def listed(self, session_id: str, listing: Listing) -> None:
        """``listing.node_id`` lists ``session_id`` (as it connected)."""
        self.listings.add(session_id, listing)

    def gone(self, session_id: str, identity: Identity, not_held_by: set[str]) -> Listing | None:
        """Where ``session_id``, which no node holds now, was listed, when it is gone for
        sure for ``identity`` (its owner or an admin): the node that listed it, the only
        one, is among ``not_held_by``, those that have just answered that they do not hold
        it (an id more than one node lists is believed of none: one of them lies)."""
        listing = self.listings.sole(session_id)
        if listing is None or not identity.owns(listing.owner):
            return None
        return listing if listing.node_id in not_held_by else None

    def close_later(self, session_id: str, identity: Identity) -> bool:
        """``identity`` ended ``session_id`` while no node knew it: its node is asked to
        end it in ``identity``'s name once it lists it (``SessionInventory``). Kept per
        identity, so another identity's end of the id cannot take the place of its owner's,
        and at most ``MAX_KEPT_ENDS`` per identity, so one identity's ends of made-up ids
        cannot push the others' out of the table. True: kept; False: not (the caller is to
        ask again, not be told its session ended)."""
        closers = self._closing.get(session_id)
        if closers is None and len(self._closing) >= self.capacity:
            return False  # full (many identities' ends): pushing one out would drop an end told 410
        closers = self._closing.setdefault(session_id, {})
        if (
            identity not in closers
            and len(closers) < MAX_CLOSERS  # the first ones stay: a stranger's cannot push out
            and self._kept_ends[identity] < MAX_KEPT_ENDS
        ):
            closers[identity] = None
            self._kept_ends[identity] += 1
        if not closers:
            del self._closing[session_id]
        return identity in closers

    def take_close(self, session_id: str, owner: str) -> Identity | None:
        """One who asked to end ``session_id`` (of ``owner``, as a node lists it) and may,
        while no node knew it; the session's asks are then done with. A listing whose owner
        none of them may end leaves them kept, and an end carried out is carried out again
        for the next node that lists the id: the first to list it may be a rogue node that
        learnt the id (naming any owner), and took the end from the session's own node."""
        closers = self._closing.get(session_id, {})
        closer = next((identity for identity in closers if identity.owns(owner)), None)
        if closer is None:
            carried = self._carried.get(session_id)
            return carried if carried is not None and carried.owns(owner) else None
        del self._closing[session_id]
        self._drop_closers(closers)
        _bounded_put(self._carried, session_id, closer, self.capacity)
        return closer

    def forget_closes(self) -> None:
        self._closing.clear()
        self._kept_ends.clear()
        self._carried.clear()

    def _drop_closers(self, closers: dict[Identity, None]) -> None:
        for identity in closers:
            self._kept_ends[identity] -= 1
            if not self._kept_ends[identity]:
                del self._kept_ends[identity]


async def release_orphans(state: Any, node_id: str) -> None:
    """A lost node came back with the same server: it still holds the sessions the router
    ended when it left (they answer 410 here for good), so each is deleted there in its
    owner's name and its seat is free again instead of waiting for its idle timeout."""
    node = state.registry.nodes.get(node_id)
    if node is None:
        return
    for session_id, session in state.sessions.orphans(node_id, node.server_instance_id):
        path = f"/v1/sessions/{session_id}"
        await fetch(state, node_id, "DELETE", path, _named(Identity(session.owner)))


def node_back_handler(state: Any) -> Callable[[str], None]:
    """``Registry.on_node_back`` for ``state``: release the node's orphans in the background."""
    tasks: set[asyncio.Task[None]] = set()

    def node_back(node_id: str) -> None:
        task = asyncio.ensure_future(release_orphans(state, node_id))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return node_back


class SessionInventory:
    """In the router's first ``--reconnect-grace-seconds``, and the longest reconnect
    back-off after them, each node that connects is asked for every session it holds, once
    per connection and server instance (ROUTER §13). A session it listed and no longer holds
    is gone for sure, where the router said only "not found yet" (``SessionIndex.gone``);
    and an end asked for while no node knew the session goes to the node that lists it."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self._asked: dict[str, str] = {}  # node id -> the server instance asked
        self._answered: dict[str, str] = {}  # node id -> the server instance that answered
        self._tasks: set[asyncio.Task[None]] = set()

    def listed_already(self, session_id: str, identity: Identity) -> bool:
        """Whether a node listed ``session_id`` as ``identity``'s on the connection and server
        it still has: that node will not list it again, so an end kept for the listing
        would never be carried out. The look-up that found no node holding it began before
        that node connected, or the node did not answer it in time. So too each of several
        nodes that list the id. (A node whose listing lost entries to the table's bound
        may have listed it too: ``end_where_listed_in_part`` sends it the end at once.)"""
        return any(
            identity.owns(listing.owner) and self._still_has(listing.node_id, listing.instance_id)
            for listing in self.state.sessions.listings.of(session_id)
        )

    def end_where_listed_in_part(self, session_id: str, identity: Identity) -> None:
        """An end kept for ``session_id`` (in ``identity``'s name) goes at once to each node
        whose listing lost entries to the table's bound and that still has the connection
        and server it listed on: it listed more than its share, may have listed this id,
        and lists no more. Before, such a node kept every end from being kept (each read
        the 503 "not found yet"), so a rogue node that flooded the listing and stayed
        connected turned off the ends of the real nodes' sessions for the whole grace.
        Such a node learns the id and the caller's name, as every node does from a look-up
        of an id the router has not bound."""
        incomplete = self.state.sessions.listings.incomplete
        for node_id in [n for n, instance in incomplete.items() if self._still_has(n, instance)]:
            task = asyncio.get_running_loop().create_task(
                self._end_kept(node_id, session_id, identity, quiet_if_unknown=True)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def listers(self, session_id: str) -> set[str]:
        """The nodes that listed ``session_id`` on the connection and server they still have."""
        return {
            listing.node_id
            for listing in self.state.sessions.listings.of(session_id)
            if self._still_has(listing.node_id, listing.instance_id)
        }

    def disputed(self, session_id: str, session: RoutedSession) -> bool:
        """Whether the binding ``session`` of ``session_id`` came from a node's claim (a list
        or a look-up, not its owner's create) that another node's listing (on the
        connection and server it still has) outweighs: the bound node listed the id too,
        or answered its own listing without it. Session ids are fresh UUIDs, so one of the
        two lies, and the claim no longer decides where the owner's requests go
        (``believed``). A rogue node that claimed alice's id before her node was back kept
        her programs after her node listed it (ROUTER §13). A bound node that gave no
        listing (it connected after the listings were asked) keeps its binding: a rogue's
        listing is no better word than its claim."""
        if session.created or session.ended is not None:
            return False
        listers = self.listers(session_id)
        node = session.node_id
        return bool(listers - {node}) and (node in listers or self._listed_whole(node))

    def believed(self, session_id: str, claims: list[tuple[str, str]]) -> tuple[str, str] | None:
        """Which ``(node, owner)`` of the nodes that claim ``session_id`` in a look-up
        (``claims``, each for an owner the caller may see) the router believes.

        A session lives on one node and its id is a fresh UUID, so two nodes' word for one
        id means one of them lies (a rogue node, a node-token holder that learnt the id).
        An honest node lists every session it holds as it connects, so the one node that
        listed the id beats claimers that answered their own listing without it; two that
        listed it are believed of neither, and so are claims no listing separates (a
        claimer that gave no listing, or two claims and no listing). A rogue node can keep
        a session from its owner that way (it lists the id too), never take it from the
        node that listed it."""
        listers = self.listers(session_id)
        if len(listers) > 1:
            return None
        if not listers:
            return claims[0] if len(claims) == 1 else None
        others = [node for node, _ in claims if node not in listers]
        if not all(self._listed_whole(node) for node in others):
            return None
        return next((claim for claim in claims if claim[0] in listers), None)

    def _listed_whole(self, node_id: str) -> bool:
        """Whether ``node_id`` answered its listing on the connection and server it still
        has (what it did not list, it did not hold then)."""
        instance = self._answered.get(node_id)
        return instance is not None and self._still_has(node_id, instance)

    def listed_elsewhere(self, session_id: str, node_id: str) -> bool:
        """Whether a node other than ``node_id`` listed ``session_id`` on the connection and
        server it still has. Session ids are fresh UUIDs, so ``node_id``'s word that it holds
        the id (a new session's ``201``, a list, a look-up) then means that one of the two
        lies: a rogue node answering bob's new session with alice's id, listed by her node,
        took the id, and alice read 404 for her own session (ROUTER §13). An id bound to
        ``node_id`` already stays its: a rogue listing it must not hide it from its owner."""
        known = self.state.sessions.get(session_id)
        if known is not None and known.node_id == node_id:
            return False
        return any(
            listing.node_id != node_id and self._still_has(listing.node_id, listing.instance_id)
            for listing in self.state.sessions.listings.of(session_id)
        )

    def _still_has(self, node_id: str, instance_id: str) -> bool:
        """Whether ``node_id`` is connected and runs server ``instance_id`` still."""
        node = self.state.registry.nodes.get(node_id)
        return node is not None and node.connected and node.server_instance_id == instance_id

    def check_nodes(self) -> None:
        """Registry change: list each node that (re)connected, while it may matter."""
        for node_id in [n for n, node in self.state.registry.nodes.items() if not node.connected]:
            self._asked.pop(node_id, None)
        for node_id in [n for n in self._answered if n not in self.state.registry.nodes]:
            del self._answered[node_id]  # its record is gone: so is what it listed on
        age = time.monotonic() - self.state.started_monotonic
        if age >= self.state.settings.reconnect_grace_seconds + LONGEST_RECONNECT_SECONDS:
            self.state.sessions.forget_closes()  # every node that lived then is back by now
            return
        for node_id, node in self.state.registry.nodes.items():
            instance = node.server_instance_id
            if (
                node.connected
                and instance
                and self._asked.get(node_id) != instance
                and node.current_slots(CONTROL)
            ):
                self._asked[node_id] = instance
                task = asyncio.get_running_loop().create_task(self._list(node_id, instance))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _list(self, node_id: str, instance: str) -> None:
        answer = await fetch(self.state, node_id, "GET", "/v1/sessions", _named(LISTER))
        if answer is None:
            self._asked.pop(node_id, None)  # no slot or no answer in time: asked again
            return
        # answered: another answer than a list holds nothing (a server without sessions)
        self._answered[node_id] = instance
        if answer[0] != 200:
            # answered, with no list to give (a server without sessions, or a published
            # one): final for this server. Asked again at each check, it took a control
            # slot (and a place in the router's waiting room) every few seconds of the grace
            return
        records = untrusted_json(answer[1])  # a node-token holder wrote it
        listed = [_id_and_owner(r) for r in (records if isinstance(records, list) else [])]
        count = sum(1 for session_id, _ in listed if session_id is not None)
        self.state.log.event("node_sessions_listed", node=node_id, sessions=count)
        for session_id, owner in listed:
            if session_id is None:
                continue
            # bound or not: a rogue node's binding of the id for another identity (ROUTER
            # §13) sends the owner's requests to a look-up, whose end must know this listing
            self.state.sessions.listed(session_id, Listing(node_id, instance, owner))
            # a kept end is carried out though another request bound the session meanwhile
            # (the owner's list, a retried read): it was answered 410 already
            closer = self.state.sessions.take_close(session_id, owner)
            if closer is not None:  # in its name: the node ends only what it may end
                await self._end_kept(node_id, session_id, closer)

    async def _end_kept(
        self, node_id: str, session_id: str, closer: Identity, quiet_if_unknown: bool = False
    ) -> None:
        """Send ``node_id`` a kept end of ``session_id`` in ``closer``'s name, and say what it
        answered: its caller was told long ago that the session ended, so a refusal (or no
        answer: the session runs on until its idle timeout) is said here or nowhere.
        ``quiet_if_unknown``: a ``404`` says nothing (a node that may have listed the id,
        ``end_where_listed_in_part``, and did not)."""
        path = f"/v1/sessions/{session_id}"
        answer = await fetch(self.state, node_id, "DELETE", path, _named(closer))
        if quiet_if_unknown and answer is not None and answer[0] == 404:
            return
        fields: dict[str, Any] = {"node": node_id, "session": session_id}
        if answer is not None and 200 <= answer[0] < 300:
            self.state.log.event("kept_session_end_done", **fields)
            return
        if answer is None:
            fields["error"] = "no answer from the node"
        else:
            fields["http_status"] = answer[0]
            fields["error"] = _error_message(untrusted_json(answer[1]))
        self.state.log.event("kept_session_end_failed", "WARNING", **fields)


def _named(identity: Identity) -> list[tuple[bytes, bytes]]:
    header = identity_header(identity)
    return [(header.name, header.value)]


def session_record_id(record: Any) -> str | None:
    """The id of a node's session record (an object with a session id and an ``owner``
    string), or None for anything else."""
    if not isinstance(record, dict) or not isinstance(record.get("owner"), str):
        return None
    session_id = record.get("session_id")
    return session_id if isinstance(session_id, str) and SESSION_ID.fullmatch(session_id) else None


def _id_and_owner(record: Any) -> tuple[str | None, str]:
    """The session id and owner of a listed record (None: not a session record)."""
    session_id = session_record_id(record)
    return session_id, record["owner"] if session_id is not None else ""


def _error_message(answer: Any) -> str | None:
    """The ``error.message`` of a node's error answer (a node-token holder wrote it: the
    log escapes and cuts it), None when it has none."""
    error = answer.get("error") if isinstance(answer, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None
