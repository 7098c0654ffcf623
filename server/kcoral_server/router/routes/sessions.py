"""Sessions through the router (EXTENSIONS §11, ROUTER §13): a session lives on one node.

* ``POST /v1/sessions`` asks every ready node's ``/v1/info`` (as the caller) and goes to
  the node with the most free session seats for the caller (free seats, capped by what the
  caller may still hold there under the node's per-identity cap); the router reads the session id
  from the node's 201 answer and remembers its node, server instance and owner.
* ``GET /v1/sessions`` asks every connected node and merges the caller's lists.
* ``/v1/sessions/{id}`` (``GET``, ``DELETE``) and its ``/execute``, ``/jobs`` and
  ``/interrupt`` go to the session's node on a control slot (a session's programs run on its
  own seat, never on a stateless worker's); an id the router has not seen is looked up on
  every node first (the router may have restarted).
* A node that leaves the router (its stream ends or goes stale) or whose server instance
  changes has lost its sessions' state: from then on the router answers every request for
  them ``410 session_ended`` itself, naming the node, even if the node comes back; one
  that comes back with the same server is asked to end them (their seats are free again).

Who can reach what: every request carries the identity the router checked
(``X-KCoral-Identity``, believed by the node only with the router secret), so the node
answers another identity's session as an unknown one (404); the router's own answers for
lost sessions apply the same rule from the owner it learned. A binding serves its owner: a
rogue node (a node-token holder) that answered bob with alice's id holds it for bob alone,
and alice's look-up reaches the node it believes (``SessionInventory.believed``); a claim
another node's listing outweighs stops deciding where the owner's requests go.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, TypeGuard

from kcoral.protocol.selector import SELECTOR_MISMATCH
from kcoral_server.front_door.callers import Identity
from kcoral_server.router.admission.scheduler import NoNode, RouterStopping
from kcoral_server.router.admission.selection import (
    offering_nodes,
    selector_fits_session,
    session_nodes,
)
from kcoral_server.router.auth import error_answer
from kcoral_server.router.forwarding.answer import BUFFERED_ANSWER_LIMIT
from kcoral_server.router.forwarding.forward import ForwardHandler, check_length
from kcoral_server.router.nodes.registry import SERVER_RESTARTED
from kcoral_server.router.nodes.slot import CONTROL
from kcoral_server.router.routes.fan_out import (
    answers_to_merge,
    ask_every_node,
    error_kind,
    merged_answer,
    not_found_yet,
    sole_claims,
    untrusted_json,
    warn_contested,
)
from kcoral_server.router.routes.jobs import learn_submitted_job
from kcoral_server.router.routes.session_index import (
    SESSION_ID,
    RoutedSession,
    session_record_id,
)
from kcoral_server.sessions.seat_shares import seat_count

NOT_FOUND = "unknown session id"
NO_SEAT = "no node offers a free session seat"
#: A session's end asked for in the router's first seconds, before any node knew it
CLOSE_KEPT = (
    "session ended for you: the router has just started and the node that holds it has not "
    "reconnected; the router ends it there when it does"
)
#: How long a session's cut-off request watches its server's slots before it is told the
#: server is gone: a dead server's never come back, a live one's reconnect within about
#: 1.2 s of a dropped connection (the tunnel's first retry, ROUTER §5).
SERVER_GONE_WAIT = 3.0
#: The most of a ``POST /v1/sessions`` body the router holds to read its ``gpu_count``.
MAX_SESSION_BODY = BUFFERED_ANSWER_LIMIT


def offers_sessions(info: Any) -> bool:
    features = info.get("features") if isinstance(info, dict) else None
    return isinstance(features, list) and "sessions" in features


def free_seats(info: Any) -> int:
    """The session seats a node's ``/v1/info`` (asked as the caller) offers the caller: its
    free seats, no more than the caller may still take under the node's per-identity cap
    (``max_per_identity`` - ``held_by_you``; EXTENSIONS §11), so a session never goes to a
    node that would refuse it for the cap while another has room."""
    counts = info.get("sessions") if isinstance(info, dict) else None
    if not isinstance(counts, dict):
        return 0
    free = _count(counts, "max") - _count(counts, "active")
    cap = counts.get("max_per_identity")
    if _is_count(cap):  # absent or null: no cap (or a node from before the cap)
        free = min(free, cap - _count(counts, "held_by_you"))
    return max(free, 0)


def no_seat_message(offers: list[dict[str, Any]]) -> str:
    """``no node offers a free session seat`` (ROUTER §13), then the fleet's seats as the
    nodes' ``/v1/info`` gave them to the caller, and whether the caller's own sessions are
    what stands in the way: at its per-identity cap on every node with a free seat, only
    ending one of its sessions helps, and waiting for others does not."""
    if not offers:
        return NO_SEAT
    seats = sum(_count(c, "max") for c in offers)
    held = sum(_count(c, "active") for c in offers)
    mine = sum(_count(c, "held_by_you") for c in offers)
    nodes = "1 node" if len(offers) == 1 else f"{len(offers)} nodes"
    text = f"{NO_SEAT}: {seat_count(seats)} on {nodes}, {held} held, {mine} by you"
    capped = [
        c["max_per_identity"]
        for c in offers
        if _count(c, "max") > _count(c, "active")
        and _is_count(c.get("max_per_identity"))
        and _count(c, "held_by_you") >= c["max_per_identity"]
    ]
    if capped:
        caps = ", ".join(str(cap) for cap in sorted(set(capped)))
        text += (
            f"; where seats are free you hold the most one identity may ({caps}): "
            "end one of your sessions"
        )
    return text


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(counts: dict[str, Any], key: str) -> int:
    value = counts.get(key, 0)
    return value if _is_count(value) else 0


async def server_gone(registry: Any, node_id: str, instance_id: str) -> bool:
    """Whether ``node_id``'s server ``instance_id`` is gone: the node reports another server
    or has left, or after ``SERVER_GONE_WAIT`` seconds no slot of that server is open. Its
    slots share one connection, so a server that dies loses them all at once; but so does a
    live server whose connection to the router dropped, and its slots reconnect: told gone
    as soon as every slot had closed, such a session was ended for the router while its
    server still held it (review). A slot open at the end (one that stayed, or one that
    reconnected) says the server lives."""
    deadline = time.monotonic() + SERVER_GONE_WAIT
    while True:
        node = registry.nodes.get(node_id)
        if node is None or node.server_instance_id != instance_id:
            return True
        if time.monotonic() >= deadline:
            return not any(
                s.instance_id == instance_id and not s.closed.is_set() for s in node.slots.values()
            )
        await asyncio.sleep(0.05)


def may_see(identity: Identity, session: RoutedSession) -> bool:
    return identity.admin or identity.name == session.owner


def created_at(record: dict[str, Any]) -> int | float:
    """A listed session's sort key: its ``created_at`` (Unix seconds); 0 for anything else
    (a string, a bool, NaN or an infinity a node sent), so sorting never fails."""
    value = record.get("created_at")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return value  # ints compare exactly with floats, however many digits (no float())


def requested_gpu_count(body: bytes) -> int | None:
    """The ``gpu_count`` a ``POST /v1/sessions`` body asks for, or None (absent, or not a
    count: the node answers such a body with its own ``400``)."""
    document = untrusted_json(body)  # nested too deep, say: the node's 400, not a 500
    value = document.get("gpu_count") if isinstance(document, dict) else None
    return value if _is_count(value) and value >= 1 else None


class SessionsHandler(ForwardHandler):
    """``POST /v1/sessions`` (to the node with the most free seats among those that fit its
    selector and its ``gpu_count``) and ``GET`` (merged).

    The small body is held until it is whole (at most ``MAX_SESSION_BODY``): its
    ``gpu_count`` decides which nodes may take the session (ROUTER §13)."""

    SLOT_KIND = CONTROL
    ALLOWED = ("GET", "POST")

    async def prepare(self) -> None:
        self.held: bytearray | None = None
        self.gpu_count: int | None = None
        if self.request.method == "GET":
            self.check_request()
            return
        if self.check_request() and check_length(self) and self.read_selector() is not None:
            if (self.declared or 0) > MAX_SESSION_BODY:
                self._too_large()
                return
            self.held = bytearray()

    def _too_large(self) -> None:
        message = f"a session body is at most {MAX_SESSION_BODY} bytes"
        self.send_router_error(413, "request_too_large", message, "request_rejected")

    async def data_received(self, chunk: bytes) -> None:
        if self.held is None:
            await super().data_received(chunk)
        elif not self._finished:
            self.held += chunk
            if len(self.held) > MAX_SESSION_BODY:
                self.held = None
                self._too_large()

    async def post(self, *args: str) -> None:
        if self.held is None or self._finished:
            return
        body, self.held = bytes(self.held), None
        self.gpu_count = requested_gpu_count(body)
        self.declared = len(body)  # the held body goes on with its length, chunked or not
        await self.forward_head()
        if body:
            await self.data_received(body)
        await super().post()

    async def choose_node(self) -> str | None:
        registry = self.state.registry
        if not self.selector and not offering_nodes(registry, {}):
            self.no_node()  # no ready node of the default kind: as before selectors
            return None
        if not self.offered(self.selector):
            return None
        among = session_nodes(registry, self.selector, self.gpu_count)
        answers = await ask_every_node(self, "/v1/info", among=among)
        if not answers:
            self.no_node()
            return None
        free: dict[str, int] = {}
        offers: list[dict[str, Any]] = []
        for node, answer, _headers in answers:
            if answer is None or answer[0] != 200:
                continue
            info = untrusted_json(answer[1])
            self.state.fleet_limits.learn(registry, node, info)
            if info is None:
                continue  # an answer the router cannot read: that node is not chosen
            if offers_sessions(info):
                self.state.sessions.offering.add(node)
                free[node] = free_seats(info)
                offers.append(info["sessions"])
            else:
                self.state.sessions.offering.discard(node)
        if not free or max(free.values()) < 1:
            # refused at once, as a selector no node fits: nothing waited in a queue
            self.send_router_error(503, "busy", no_seat_message(offers), "request_rejected")
            return None
        return max(free, key=lambda node: (free[node], node))

    def buffer_answer(self, status: int) -> bool:
        return status == 201

    def rewrite(self, status: int, body: bytes) -> bytes:
        # the session the node made for the caller is the caller's, whatever owner it names:
        # a rogue node answering with another identity's session id and owner got that
        # identity's programs (ROUTER §13)
        record = untrusted_json(body)  # unreadable: relayed, nothing learnt
        self._learn(self.node, record, self.identity.name)
        return body

    def _learn(self, node_id: str | None, record: Any, owner: str | None = None) -> bool:
        """Remember a session record's node (for ``owner``, the caller whose create the node
        answered, else the record's, a claim); False for a record that is not one."""
        session_id = session_record_id(record)
        if session_id is None or node_id is None:
            return False
        if self.state.inventory.listed_elsewhere(session_id, node_id):
            return False  # another node's listing has it: one of them lies, believed of none
        node = self.state.registry.nodes.get(node_id)
        instance = node.server_instance_id if node is not None else ""
        created = owner is not None
        owner = record["owner"] if owner is None else owner
        return self.state.sessions.remember(session_id, node_id, instance, owner, created)

    async def get(self, *args: str) -> None:
        answers = await answers_to_merge(self, "/v1/sessions")
        if answers is None:
            return
        listings: list[tuple[str, str, Any]] = []
        for node, answer, _headers in answers:
            if answer is None or answer[0] != 200:
                continue  # a node that cannot answer now (or has no sessions) is left out
            records = untrusted_json(answer[1])  # unreadable: that node is left out
            for record in records if isinstance(records, list) else []:
                session_id = session_record_id(record)
                # a node lists the caller only what it may see: another identity's record
                # is a rogue node's, to bind that identity's session to itself (ROUTER §13)
                if session_id is not None and self.identity.owns(record["owner"]):
                    listings.append((node, session_id, record))
        kept, contested = sole_claims(listings, self._bound_node)
        warn_contested(self, "session_claimed_twice", contested)
        merged = [record for node, _, record in kept if self._learn(node, record)]
        merged_answer(self, merged, created_at)

    def _bound_node(self, session_id: str) -> str | None:
        """The node a list's record of ``session_id`` must come from; None where no binding
        decides (a disputed claim is no binding: several nodes listing the id are then
        believed of none)."""
        session = self.state.sessions.get(session_id)
        if session is None or self.state.inventory.disputed(session_id, session):
            return None
        return session.node_id


class SessionHandler(ForwardHandler):
    """``GET``/``DELETE /v1/sessions/{id}`` and ``POST …/execute``, ``…/jobs``,
    ``…/interrupt``: to the session's node, or ``410`` once that node is gone."""

    SLOT_KIND = CONTROL
    ALLOWED: tuple[str, ...] = ("GET", "DELETE")

    def check_request(self) -> bool:
        if self.path_args[1] is not None:  # /execute, /jobs and /interrupt are POSTs
            self.ALLOWED = ("POST",)
        self.holds_slot_long = self.path_args[1] == "/execute"  # while the program runs
        if self.holds_slot_long:
            self.state.session_programs.add(self)
        return super().check_request()

    def on_finish(self) -> None:
        self.state.session_programs.discard(self)
        super().on_finish()

    def on_connection_close(self) -> None:
        self.state.session_programs.discard(self)
        super().on_connection_close()

    async def choose_node(self) -> str | None:
        session_id = self.path_args[0]
        if not SESSION_ID.fullmatch(session_id):
            self.send_router_error(404, "not_found", NOT_FOUND, "request_rejected")
            return None
        index = self.state.sessions
        session = index.get(session_id)
        if session is None:
            return await self._look_up(session_id)
        if not may_see(self.identity, session):
            # another identity's session answers exactly as an unknown id; the node says so
            # too, so it is asked (it may be an admin's or a renamed owner's)
            return await self._look_up(session_id)
        if self.state.inventory.disputed(session_id, session):
            # a node's claim that another node's listing contradicts: the evidence decides
            return await self._look_up(session_id)
        node = self.state.registry.nodes.get(session.node_id)
        if session.ended is None and (node is None or not node.connected):
            index.node_lost(session.node_id, "left the router")
        elif (
            session.ended is None
            and node is not None
            and node.server_instance_id
            not in (
                session.instance_id,
                "",
            )
        ):
            index.server_restarted(session.node_id, node.server_instance_id)
        if session.ended is not None:
            self.send_router_error(410, "session_ended", session.ended, "request_rejected")
            return None
        return self._fitting(session.node_id)

    def _fitting(self, node_id: str) -> str | None:
        """``node_id`` for a request of the session; a program (``/execute``, ``/jobs``)
        whose selector that node does not fit gets ``409 selector_mismatch``: a session's
        programs run on its node, never elsewhere."""
        if self.path_args[1] not in ("/execute", "/jobs"):
            return node_id
        if self.read_selector() is None:
            return None
        mismatch = selector_fits_session(self.state.registry.nodes.get(node_id), self.selector)
        if mismatch is not None:
            self.send_router_error(409, SELECTOR_MISMATCH, mismatch, "request_rejected")
            return None
        return node_id

    def no_node(self, cause: NoNode | None = None) -> None:
        # The session's node went away while this request waited for its control slot.
        if isinstance(cause, RouterStopping):
            super().no_node(cause)
            return
        session = self.state.sessions.get(self.path_args[0])
        if session is not None and not may_see(self.identity, session):
            session = None  # another identity's binding: this request was looked up, unbound
        node = self.state.registry.nodes.get(session.node_id) if session is not None else None
        if session is not None and session.ended is None and (node is None or not node.connected):
            self.state.sessions.node_lost(session.node_id, "left the router")
        if session is not None and session.ended is not None:
            self.send_router_error(410, "session_ended", session.ended, "request_rejected")
            return
        super().no_node(cause)

    async def slot_broke(self) -> None:
        """The session's request was cut off: where its node's server is gone with it (every
        slot of that server closed), the session ended there, and the first answer says so
        (``410``, as the next request's does), not a bare ``502`` (ROUTER §13)."""
        session = self.state.sessions.get(self.path_args[0])
        if (
            session is not None
            and session.ended is None
            and session.node_id == self.node
            and not self.state.admission.closed
            and await server_gone(self.state.registry, session.node_id, session.instance_id)
        ):
            self.state.sessions.server_lost(session.node_id, session.instance_id)
        if self._finished or session is None or session.ended is None:
            if not self._finished:
                await super().slot_broke()
            return
        reason = self.finish_reason or "tunnel_disconnected"
        self.send_router_error(410, "session_ended", session.ended, reason)

    def buffer_answer(self, status: int) -> bool:
        return (status == 202 and self.path_args[1] == "/jobs") or status == 404

    def rewrite(self, status: int, body: bytes) -> bytes:
        if status == 404:
            return self._unknown_to_a_new_server(body)
        return learn_submitted_job(self, body)  # read through /v1/jobs/{id}

    def _unknown_to_a_new_server(self, body: bytes) -> bytes:
        """A request that chose the session's node before that node's server was replaced
        waits for a control slot and reaches the new server, which never held the session:
        its ``404`` told the owner of a session it had just used that the id is unknown
        (jobs soak). The state went with the old server: ``410``, as for the next request."""
        session = self.state.sessions.get(self.path_args[0])
        slot_instance = getattr(self.slot, "instance_id", "")
        if (
            session is None
            or session.node_id != self.node
            or not may_see(self.identity, session)
            or error_kind(body) != "not_found"
            or slot_instance in ("", session.instance_id)
        ):
            return body
        session.lose("restarted its server")  # this one only: others may be the new server's
        self.clear()
        return error_answer(self, self.request_id, 410, "session_ended", str(session.ended))

    async def _look_up(self, session_id: str) -> str | None:
        claims: list[tuple[str, str]] = []  # (node, owner) of every node that says it holds it
        not_held: set[str] = set()  # the nodes that answered they do not
        for node, answer, _headers in await ask_every_node(self, f"/v1/sessions/{session_id}"):
            if answer is None:
                continue
            status, body = answer
            if status == 404:
                not_held.add(node)
            if status == 200:
                record = untrusted_json(body)
                owner = record.get("owner") if isinstance(record, dict) else None
                # else no session record, or (from a rogue node) one the caller may not see
                if isinstance(owner, str) and self.identity.owns(owner):
                    claims.append((node, owner))
            elif not claims and (status == 401 or error_kind(body) == "unauthorized"):
                self.send_router_error(
                    401, "unauthorized", "missing or invalid bearer token", "request_rejected"
                )
                return None
        known = self.state.sessions.get(session_id)
        listers = self.state.inventory.listers(session_id)
        believed = self.state.inventory.believed(session_id, claims)
        # the 410 of a session the caller may see that the router knows ended: it stays ended
        ended = known.ended if known is not None and may_see(self.identity, known) else None
        if believed is not None and ended is None:
            node, owner = believed
            if self._bind(session_id, node, owner, known):
                return self._fitting(node)
        disputing = {node for node, _ in claims} | (listers if claims else set())
        if len(disputing) > 1:  # one of them lies: the admin learns which nodes to look at
            nodes = ",".join(sorted(disputing))
            self.state.log.event(
                "session_claimed_twice", "WARNING", session=session_id, nodes=nodes
            )
        if ended is not None:
            self.send_router_error(410, "session_ended", ended, "request_rejected")
        elif not claims and known is None and self._gone(session_id, not_held):
            pass  # the node that listed it no longer holds it: the final answer at once
        # another identity's session answers as an unknown id, in the grace too (ROUTER §13)
        elif (
            claims
            or (known is not None and may_see(self.identity, known))
            or not self._not_found_yet(session_id, len(not_held))
        ):
            self.send_router_error(404, "not_found", NOT_FOUND, "request_rejected")
        return None

    def _bind(self, session_id: str, node: str, owner: str, known: RoutedSession | None) -> bool:
        """Bind ``session_id`` to ``node``, the node the evidence names for the caller
        (``SessionInventory.believed``); False: the caller is not to reach it. Who can reach
        what: a binding of another identity's stays as it is (a rogue node's answer to bob,
        naming alice's id, bound it to the rogue for bob), and the caller reaches ``node``
        unbound, each request looked up: moved on alice's word, bob's binding to his honest
        node could be taken by a rogue node that claims the id for a token holder it works
        with. The caller's own binding moves only from a disputed claim
        (``SessionInventory.disputed``)."""
        record = self.state.registry.nodes.get(node)
        instance = record.server_instance_id if record is not None else ""
        index = self.state.sessions
        if index.remember(session_id, node, instance, owner):
            return True
        if known is None or not may_see(self.identity, known):
            return True  # another identity's binding: it stays theirs
        if not self.state.inventory.disputed(session_id, known):
            return False  # its owner's create, or a claim no listing contradicts
        index.rebind(session_id, node, instance, owner)
        return True

    def _gone(self, session_id: str, not_held: set[str]) -> bool:
        """Answer a session gone for sure (``SessionIndex.gone``): ``410`` where the node
        that listed it runs another server now, ``404`` where the same server dropped it.
        Before, the router's first seconds answered "not found yet" and the client asked
        again for 10 s for a session its node's restart had ended. True: answered."""
        listing = self.state.sessions.gone(session_id, self.identity, not_held)
        if listing is None:
            return False
        node = self.state.registry.nodes.get(listing.node_id)
        if node is None or node.server_instance_id in ("", listing.instance_id):
            self.send_router_error(404, "not_found", NOT_FOUND, "request_rejected")
            return True
        ended = RoutedSession(listing.node_id, listing.instance_id, listing.owner)
        ended.lose(SERVER_RESTARTED)
        self.send_router_error(410, "session_ended", str(ended.ended), "request_rejected")
        return True

    def _not_found_yet(self, session_id: str, not_held_by: int) -> bool:
        """In the router's first seconds, an id no node knows may be on a node that has not
        reconnected: ``503`` "not found yet" (the client asks again), but its end is kept
        and answered at once (``410``), so a kernel that exits, or a script's last line, is
        not held for the client's 10 s; the node that lists it is asked to end it in the
        caller's name (``SessionInventory``). True: answered."""
        message = not_found_yet(self, "session", not_held_by)
        if message is None:
            return False
        # an end kept for a node that has listed the session already would never be carried
        # out, though answered 410: the client asks again and finds the node this time; so
        # too for an end not kept (its caller's kept ends, or the id's callers, at their most)
        if (
            self.request.method != "DELETE"
            or self.state.inventory.listed_already(session_id, self.identity)
            or not self.state.sessions.close_later(session_id, self.identity)
        ):
            self.send_router_error(503, "no_node", message, "node_gone")
            return True
        self.state.inventory.end_where_listed_in_part(session_id, self.identity)
        self.send_router_error(410, "session_ended", CLOSE_KEPT, "request_rejected")
        return True
