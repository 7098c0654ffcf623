"""``/v1/info`` and the jobs endpoints of EXTENSIONS §1, §5 through the router.

* ``POST /v1/jobs`` is scheduled like ``/execute`` (worker slot, ``X-KCoral-Node``
  affinity); the router reads the job id from the 202 answer and remembers its node.
* ``GET /v1/jobs`` asks every connected node and merges the lists, newest first.
* ``/v1/jobs/{id}[/events|/result]`` and ``DELETE /v1/jobs/{id}`` go to the job's node on a
  control slot; an id the router has not seen is looked up on every node first (the router
  may have restarted), and one no node knows is 404 ``not_found``.
* ``GET /v1/info`` goes to any ready node on a control slot.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from kcoral.protocol.strict_json import dumps_compact, loads_strict
from kcoral_server.front_door.callers import Identity
from kcoral_server.jobs.job_listing import (
    LEFT_OUT_HEADER,
    LIMIT_PROBLEM,
    NODES_LEFT_OUT_HEADER,
    left_out_count,
    listing_limit,
)
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.auth import UNAUTHORIZED_MESSAGE, error_answer
from kcoral_server.router.forward import ForwardHandler, ProgramForwardHandler
from kcoral_server.router.headers import METHOD_HEADER, PATH_HEADER, identity_header
from kcoral_server.router.identity import MAX_FRAME_DATA
from kcoral_server.router.registry import SERVER_RESTARTED, NodeRecord
from kcoral_server.router.scheduler import NoNode, RouterBusy
from kcoral_server.router.selection import fleet, fleet_status
from kcoral_server.router.slot import CONTROL, SlotBroken

JOB_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
FAN_OUT_SLOT_WAIT = 10.0  # seconds one node may keep a list or lookup waiting for a slot
FAN_OUT_ANSWER_WAIT = 30.0
MAX_FETCHED_BYTES = 64 << 20
#: one node's answer to a fan-out GET: its id, ``(status, body)`` (None: no answer in time)
#: and the answer's headers (lower-cased names)
NodeAnswer = tuple[str, tuple[int, bytes] | None, dict[str, str]]


class JobIndex:
    """Job id → node id and owner, learned from 202 answers, merged lists and look-ups
    (bounded), and whether the node has run a new server since (the job went with the old)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        # job id → (node id, owner, the node's new servers when the job was bound to it)
        self._nodes: OrderedDict[str, tuple[str, str, int]] = OrderedDict()
        self._servers: defaultdict[str, int] = defaultdict(int)  # node id → new servers run

    def node_lost(self, node_id: str, why: str) -> None:  # Registry.on_node_lost
        if why == SERVER_RESTARTED and node_id in self._servers:  # a node that took jobs:
            self._servers[node_id] += 1  # none of them went to its new server

    def lost(self, job_id: str, node_id: str | None) -> bool:  # with a server node_id replaced
        known = self._nodes.get(job_id)
        return known is not None and known[0] == node_id and known[2] != self._servers[known[0]]

    def remember(self, job_id: str, node_id: str, owner: str) -> bool:
        """Bind ``job_id`` to ``node_id``; False when another node holds it already: a job
        lives on one node, and a rogue node that claims another's job id (in its list or a
        look-up) must not get that job's reads and cancels with its owner's identity."""
        known = self._nodes.get(job_id)
        if known is not None and known[0] != node_id:
            return False
        self._nodes[job_id] = (node_id, owner, self._servers[node_id])
        self._nodes.move_to_end(job_id)
        while len(self._nodes) > self.capacity:
            self._nodes.popitem(last=False)
        return True

    def node_of(self, job_id: str) -> str | None:
        known = self._nodes.get(job_id)
        return known[0] if known is not None else None

    def owner_of(self, job_id: str) -> str | None:
        known = self._nodes.get(job_id)
        return known[1] if known is not None else None

    def visible_to(self, job_id: str, identity: Identity) -> bool:
        """Whether ``identity`` may learn anything of the bound ``job_id``: its owner or an
        admin (EXTENSIONS §5). The router answers for a job itself while its node is away
        (503 ``node_gone``), and another identity must get an unknown id's answer there."""
        known = self._nodes.get(job_id)
        return known is not None and identity.owns(known[1])

    def __len__(self) -> int:
        return len(self._nodes)


async def fetch(
    state: Any,
    node_id: str,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    answer_headers: dict[str, str] | None = None,
    identity: str = "",
) -> tuple[int, bytes] | None:
    """One bodiless request to ``node_id`` on a control slot, answer collected whole (its
    headers, lower-cased names, into ``answer_headers`` when given), sent for ``identity``
    ("" the router's own). ``None`` when no control slot came in time or the slot failed."""
    request_id, wait = str(uuid.uuid4()), FAN_OUT_SLOT_WAIT
    try:
        _node, slot = await state.control.acquire(node_id, request_id, wait, identity=identity)
    except (NoNode, RouterBusy):
        return None
    done = False
    try:
        head = pb.RequestHead(
            headers=[
                pb.HttpHeader(name=METHOD_HEADER, value=method.encode()),
                pb.HttpHeader(name=PATH_HEADER, value=path.encode()),
                *(pb.HttpHeader(name=n, value=v) for n, v in headers),
                pb.HttpHeader(name=b"x-request-id", value=request_id.encode()),
                pb.HttpHeader(name=b"content-length", value=b"0"),
            ],
            content_length=0,
        )
        await slot.send(pb.SlotFrame(request_id=request_id, request_head=head))
        await slot.send(pb.SlotFrame(request_id=request_id, end=pb.EndOfBody()))
        answer = await asyncio.wait_for(_collect(slot, answer_headers), FAN_OUT_ANSWER_WAIT)
        done = answer is not None
        return answer
    except (SlotBroken, asyncio.TimeoutError):
        return None
    finally:
        if done:
            state.registry.release(slot)
        else:
            slot.cancel("invalid_response")


async def _collect(slot: Any, answer_headers: dict[str, str] | None) -> tuple[int, bytes] | None:
    head = await slot.next_frame()
    if head.WhichOneof("payload") != "response_head":
        return None
    if answer_headers is not None:
        for header in head.response_head.headers:
            name = header.name.decode("latin-1").lower()
            answer_headers[name] = header.value.decode("latin-1")
    parts: list[bytes] = []
    size = 0
    while True:
        frame = await slot.next_frame()
        kind = frame.WhichOneof("payload")
        if kind == "end":
            return head.response_head.status, b"".join(parts)
        if kind != "data" or len(frame.data) > MAX_FRAME_DATA:
            return None
        size += len(frame.data)
        if size > MAX_FETCHED_BYTES:
            return None
        parts.append(frame.data)


def untrusted_json(body: bytes) -> Any:
    """The document in ``body``, a node's answer (a node-token holder wrote it) or a small
    client body, or None when it is no strict JSON the router can read: not UTF-8, NaN or
    a duplicate key, nested deeper than the parser goes (``RecursionError``), an integer
    over 4300 digits. Every caller wants an object or a list, so a JSON ``null`` reads the
    same: the answer is left out of a merge or teaches the router nothing."""
    try:
        return loads_strict(body)
    except (ValueError, RecursionError, TypeError):  # ValidationError is a ValueError
        return None


def error_kind(body: bytes) -> str | None:
    document = untrusted_json(body)
    try:
        kind = document["error"]["kind"]
    except (KeyError, TypeError, IndexError):
        return None
    return kind if isinstance(kind, str) else None


#: the most of a node's ``job_expired`` message a router repeats as its own
MAX_EXPIRY_MESSAGE = 300


def expiry_message(body: bytes) -> str:
    """The message of a node's ``404 job_expired``, which says why the job went
    (EXTENSIONS §5), when it reads as one (a node-token holder wrote it): printable text
    starting ``job expired``, at most ``MAX_EXPIRY_MESSAGE`` characters; else the bare
    ``job expired``."""
    document = untrusted_json(body)
    try:
        message = document["error"]["message"]
    except (KeyError, TypeError, IndexError):
        message = None
    if (
        isinstance(message, str)
        and message.startswith("job expired")
        and len(message) <= MAX_EXPIRY_MESSAGE
        and message.isprintable()
    ):
        return message
    return "job expired"


def sole_claims(
    listings: Iterable[tuple[str, str, Any]], bound: Callable[[str], str | None]
) -> tuple[list[tuple[str, str, Any]], dict[str, list[str]]]:
    """Which ``(node, id, record)`` listings of a merged list may be shown and bound.

    A job or session lives on one node, so an id that several nodes list in one merge
    while none of them holds it already is claimed by a liar (a rogue node-token holder
    that learnt it): none of them is believed, and the id is returned among the contested
    ones (id → nodes) instead. An id bound to a node (``bound``) that lists it keeps that
    node's record. Each node's first record of an id counts."""
    by_id: dict[str, dict[str, Any]] = {}
    for node, item_id, record in listings:
        by_id.setdefault(item_id, {}).setdefault(node, record)
    kept: list[tuple[str, str, Any]] = []
    contested: dict[str, list[str]] = {}
    for item_id, records in by_id.items():
        owner = bound(item_id)
        if len(records) == 1:
            [(node, record)] = records.items()
            kept.append((node, item_id, record))
        elif owner is not None and owner in records:
            kept.append((owner, item_id, records[owner]))
        else:
            contested[item_id] = sorted(records)
    return kept, contested


def warn_contested(handler: Any, event: str, contested: dict[str, list[str]]) -> None:
    """One WARNING a merge for the ids several nodes claimed (``sole_claims``)."""
    if contested:
        ids = sorted(contested)
        nodes = sorted({node for claimants in contested.values() for node in claimants})
        handler.state.log.event(
            event, "WARNING", ids=",".join(ids[:4]), count=len(ids), nodes=",".join(nodes)
        )


def merged_answer(
    handler: Any, records: list[Any], key: Callable[[Any], Any], most: int | None = None
) -> None:
    """Answer a merged list, ``key`` descending (newest first), its first ``most`` (None:
    all). Each record is written back on its own: one that cannot be (nested deeper than
    the encoder goes) is left out rather than failing the list for every caller."""
    parts = []
    for record in sorted(records, key=key, reverse=True)[:most]:
        try:
            parts.append(dumps_compact(record))
        except (ValueError, RecursionError, TypeError):
            continue
    handler.finish_reason = "completed"
    handler.set_header("Content-Type", "application/json")
    handler.finish(b"[" + b",".join(parts) + b"]")


def auth_headers(handler: Any) -> list[tuple[bytes, bytes]]:
    """Who asks, as the router vouches for it: never the client's own token (ROUTER §8.4);
    each node answers only with that identity's jobs (404 for another's)."""
    header = identity_header(handler.identity)
    return [(header.name, header.value)]


def job_owner(handler: Any, record: Any) -> str:
    """Whose a job record a node answered the caller is: its ``owner``, else the caller's
    (a node answers a caller only with jobs it may see)."""
    owner = record.get("owner") if isinstance(record, dict) else None
    return owner if isinstance(owner, str) else handler.identity.name


def learn_submitted_job(handler: Any, body: bytes) -> bytes:
    """Remember the node and owner of the job a 202 answer names (later requests for it go
    there); the body passes unchanged."""
    document = untrusted_json(body)
    job_id = document.get("job_id") if isinstance(document, dict) else None
    if isinstance(job_id, str) and handler.node is not None:
        handler.state.jobs.remember(job_id, handler.node, job_owner(handler, document))
    return body


def not_found_yet(handler: ForwardHandler, what: str) -> str | None:
    """The 503 message for a ``what`` no connected node knows, within the router's first
    ``--reconnect-grace-seconds`` (else None): a node reconnects with a back-off of up to
    30 s (ROUTER §5), and until it has, the jobs and sessions it holds are unknown here, not
    gone (§13). Before, a router restart answered 404 there, and `kcoral run` gave up a job
    that went on running, with nobody left to watch or cancel it (jobs soak)."""
    age = time.monotonic() - handler.state.started_monotonic
    if age >= handler.state.settings.reconnect_grace_seconds:
        return None
    return (
        f"{what} not found yet: the router started {age:.0f} s ago, and the node that holds "
        "it may not have reconnected"
    )


def answer_while_nodes_reconnect(handler: ForwardHandler, what: str) -> bool:
    """503 ``no_node`` ``not_found_yet`` within the grace; True: answered."""
    message = not_found_yet(handler, what)
    if message is None:
        return False
    handler.send_router_error(503, "no_node", message, "node_gone")
    return True


async def ask_every_node(
    handler: Any,
    path: str,
    *,
    ready_only: bool = False,
    among: Iterable[NodeRecord] | None = None,
) -> list[NodeAnswer]:
    """``GET path`` on every control node at once (or those ``among`` them), as the caller
    (``auth_headers``).

    One ``(node id, answer, its headers)`` triple a node, answer ``None`` for a node that
    could not answer in time; an empty list when no node is connected (or ready, with
    ``ready_only``)."""
    registry = handler.state.registry
    if among is None:
        controls = registry.control_nodes(ready_only=ready_only)
    else:
        wanted = {n.node_id for n in among}
        controls = [n for n in registry.control_nodes(ready_only=False) if n.node_id in wanted]
    nodes = [n.node_id for n in controls]
    headers = auth_headers(handler)
    answer_headers: list[dict[str, str]] = [{} for _node in nodes]
    answers = await asyncio.gather(
        *(
            fetch(handler.state, node, "GET", path, headers, seen, handler.identity.name)
            for node, seen in zip(nodes, answer_headers, strict=True)
        )
    )
    return list(zip(nodes, answers, answer_headers, strict=True))


async def answers_to_merge(handler: Any, path: str) -> list[NodeAnswer] | None:
    """Every connected node's answer to ``GET path``, for a merged list; ``None`` once the
    request is answered already (refused in ``prepare``, or 503 ``no_node`` without nodes)."""
    if handler._finished:
        return None
    answers = await ask_every_node(handler, path)
    if not answers:
        handler.no_node()
        return None
    return answers


def submitted_at(job: dict[str, Any]) -> str:
    """A listed job's sort key: its ``submitted_at`` (RFC 3339 text sorts by time)."""
    value = job.get("submitted_at")
    return value if isinstance(value, str) else ""


class JobsHandler(ProgramForwardHandler):
    """``POST /v1/jobs`` (forwarded like ``/execute``) and ``GET /v1/jobs`` (merged)."""

    ALLOWED = ("GET", "POST")

    async def prepare(self) -> None:
        if self.request.method == "GET":
            self.check_request()
            return
        await super().prepare()

    def buffer_answer(self, status: int) -> bool:
        return status == 202

    def rewrite(self, status: int, body: bytes) -> bytes:
        return learn_submitted_job(self, body)

    async def get(self, *args: str) -> None:
        # Each node lists at most ``limit`` (EXTENSIONS §5), and so does the merge: the
        # newest of them, saying how many it left out and whose list it could not read.
        limit = listing_limit(self.get_query_argument("limit", None))
        if limit is None:
            if not self._finished:  # answered in prepare (401) before the query is read
                self.send_router_error(400, "parse", LIMIT_PROBLEM, "rejected")
            return
        # A node applies the same default to a list asked without one.
        asked = self.get_query_argument("limit", None) is not None
        path = f"/v1/jobs?limit={limit}" if asked else "/v1/jobs"
        answers = await answers_to_merge(self, path)
        if answers is None:
            return
        listings: list[tuple[str, str, Any]] = []
        left_out, unread = 0, []
        for node, answer, headers in answers:
            if answer is None:
                unread.append(node)  # a node that cannot answer now is left out of the list
                continue
            status, body = answer
            if status != 200:
                self._relay_refusal(node, status, body)
                return
            jobs = untrusted_json(body)
            if not isinstance(jobs, list):
                unread.append(node)  # unreadable: that node is left out
                continue
            left_out += left_out_count(headers.get(LEFT_OUT_HEADER.lower()))
            for job in jobs:
                job_id = job.get("job_id") if isinstance(job, dict) else None
                if isinstance(job_id, str) and JOB_ID.fullmatch(job_id):
                    listings.append((node, job_id, job))
        kept, contested = sole_claims(listings, self.state.jobs.node_of)
        warn_contested(self, "job_claimed_twice", contested)
        merged = [
            job
            for node, job_id, job in kept
            if self.state.jobs.remember(job_id, node, job_owner(self, job))
        ]
        left_out += max(0, len(merged) - limit)
        self.set_header(LEFT_OUT_HEADER, str(left_out))
        # A node that is away (lost, within --node-retention-seconds) holds its jobs: they
        # are not in the list, and it says so rather than leave them out without a word.
        listed = {node for node, _answer, _headers in answers}
        unread += [node for node in self.state.registry.nodes if node not in listed]
        if unread:
            self.set_header(NODES_LEFT_OUT_HEADER, ",".join(sorted(unread)))
        merged_answer(self, merged, submitted_at, most=limit)

    def _relay_refusal(self, node: str, status: int, body: bytes) -> None:
        self.node = node
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("X-KCoral-Node", node)
        self.finish_reason = "completed"
        self.finish(body)


class JobHandler(ForwardHandler):
    """``GET /v1/jobs/{id}``, ``/events``, ``/result`` and ``DELETE /v1/jobs/{id}``."""

    SLOT_KIND = CONTROL
    ALLOWED: tuple[str, ...] = ("GET", "DELETE")

    def check_request(self) -> bool:
        if self.path_args[1] is not None:  # /events and /result are read-only
            self.ALLOWED = ("GET",)
        self.holds_slot_long = self.path_args[1] in ("/events", "/result")  # read at its pace
        return super().check_request()

    async def forward_head(self, gpu_count: int | None = None) -> None:
        await super().forward_head(gpu_count)
        if self.path_args[1] == "/events" and self.relay_task is not None and not self._finished:
            self.state.event_relays.add(self)  # re-checked at a token reload

    def tokens_reloaded(self) -> None:
        """A reload changed the tokens: a caller who may no longer see the job (its token
        revoked, or an admin no more, watching another identity's job) stops watching, as on
        a server (EXTENSIONS §6). Only the router can tell: the node sees the identity the
        router forwarded when the stream opened, and knows nothing of ``admin`` marks."""
        caller = self.authenticate()
        owner = self.state.jobs.owner_of(self.path_args[0])
        if caller is not None and (owner is None or caller.owns(owner)):
            return
        self.state.event_relays.discard(self)
        self.finish_reason = "request_rejected"
        self.forwarding = False
        if self.relay_task is not None:
            self.relay_task.cancel()
        if self.slot is not None:
            self.slot.cancel("request_rejected")  # the node's stream ends; a fresh slot
        self.slot_done()
        if self._finished:
            return
        if self.response_started:
            self.finish()  # the stream ends as a server's does; a reconnect gets 401 or 404
        elif caller is None:
            self.send_router_error(401, "unauthorized", UNAUTHORIZED_MESSAGE, "request_rejected")
        else:
            self.send_router_error(404, "not_found", "job not found", "request_rejected")

    def on_finish(self) -> None:
        self.state.event_relays.discard(self)
        super().on_finish()

    def on_connection_close(self) -> None:
        self.state.event_relays.discard(self)
        super().on_connection_close()

    async def choose_node(self) -> str | None:
        job_id = self.path_args[0]
        if not JOB_ID.fullmatch(job_id):
            self.send_router_error(404, "not_found", "job not found", "request_rejected")
            return None
        node = self.state.jobs.node_of(job_id)
        # Another identity's job is looked up as an unknown id (its node answers 404): sent
        # to its node, it got the router's own 503 naming that node while the node was away,
        # which told a holder of the id that the job lives (ROUTER §13).
        visible = self.state.jobs.visible_to(job_id, self.identity)
        if node is not None and node in self.state.registry.nodes and visible:
            return node
        return await self._look_up(job_id)

    async def _look_up(self, job_id: str) -> str | None:
        kinds = set()
        expired = "job expired"  # a node's message saying why, when one says so
        claims = []  # every node that says it holds the job
        owner = self.identity.name
        for node, answer, _headers in await ask_every_node(self, f"/v1/jobs/{job_id}"):
            if answer is None:
                continue
            status, body = answer
            if status == 200:
                claims.append(node)
                owner = job_owner(self, untrusted_json(body))
            elif status == 401:
                self.send_router_error(
                    401, "unauthorized", "missing or invalid bearer token", "request_rejected"
                )
                return None
            kind = error_kind(body)
            kinds.add(kind)
            if kind == "job_expired":
                expired = expiry_message(body)
        # A job lives on one node: when several claim it, one of them is lying (a rogue
        # node-token holder that learnt the id), and none is believed (ROUTER §13).
        if len(claims) == 1 and self.state.jobs.remember(job_id, claims[0], owner):
            return claims[0]
        if len(claims) > 1:
            nodes = ",".join(claims)
            self.state.log.event("job_claimed_twice", "WARNING", job=job_id, nodes=nodes)
        if "job_expired" in kinds:
            self.send_router_error(404, "job_expired", expired, "request_rejected")
        elif claims or not answer_while_nodes_reconnect(self, "job"):
            self.send_router_error(404, "not_found", "job not found", "request_rejected")
        return None

    # Within the grace an unknown id is 503 "not found yet", while a job the router has
    # bound goes to its node, which answers another identity 404: that difference told a
    # holder of someone's job id that the job lives. Such a 404 reads as the unknown id's
    # answer, without the node's name (ROUTER §13). The owner of a job that went with a
    # server its node replaced is told so: "job not found" named no cause.
    def buffer_answer(self, status: int) -> bool:
        return status == 404 and (not_found_yet(self, "job") is not None or self._lost())

    def rewrite(self, status: int, body: bytes) -> bytes:
        lost, message = self._lost(), not_found_yet(self, "job")
        if status != 404 or error_kind(body) != "not_found" or not (lost or message):
            return body
        self.clear()
        if lost:
            message = f"job lost: its node {self.node} restarted its server, which held it"
            return error_answer(self, self.request_id, 404, "not_found", message)
        return error_answer(self, self.request_id, 503, "no_node", str(message))

    def _lost(self) -> bool:
        jobs, job_id = self.state.jobs, self.path_args[0]
        return jobs.visible_to(job_id, self.identity) and jobs.lost(job_id, self.node)


#: Per-node counts a router's ``/v1/info`` leaves out (one node's numbers, not the cluster's).
NODE_LOCAL_COUNTS = ("sessions",)


class InfoHandler(ForwardHandler):
    """``GET /v1/info`` of any ready node, as the router offers it: ``auth`` is listed when
    the router needs a token, ``sessions`` when a connected node offers it (EXTENSIONS §11),
    and the answering node's own session counts are left out."""

    SLOT_KIND, ALLOWED, wait_without_a_ready_node = CONTROL, ("GET",), 10.0  # control_wait

    def buffer_answer(self, status: int) -> bool:
        return status == 200

    def rewrite(self, status: int, body: bytes) -> bytes:
        info = untrusted_json(body)  # unreadable: relayed as the node sent it
        features = info.get("features") if isinstance(info, dict) else None
        if not isinstance(features, list):
            return body
        offered = list(features)
        offering = self.state.sessions.offering
        if "sessions" in offered and self.node is not None:
            offering.add(self.node)
        elif self.node is not None:
            offering.discard(self.node)
        if "sessions" not in offered and any(
            node.connected and node.node_id in offering
            for node in self.state.registry.nodes.values()
        ):
            offered.append("sessions")
        if self.state.settings.auth_token is not None and "auth" not in offered:
            offered.append("auth")
        info["features"] = offered
        for name in NODE_LOCAL_COUNTS:
            info.pop(name, None)
        # The answering node is of the default kind; what else the fleet has (ROUTER §6).
        info["fleet"] = fleet(self.state.registry)
        # ... and what each part holds now: seats, queue, estimated wait (ROUTER §6).
        queued = self.state.admission.queued_needs()
        info["fleet_status"] = fleet_status(self.state.registry, queued)
        return dumps_compact(info)
