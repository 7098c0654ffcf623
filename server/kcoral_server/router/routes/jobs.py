"""The jobs endpoints of EXTENSIONS §1, §5 through the router.

* ``POST /v1/jobs`` is scheduled like ``/execute`` (worker slot, ``X-KCoral-Node``
  affinity); the router reads the job id from the 202 answer and remembers its node.
* ``GET /v1/jobs`` asks every connected node and merges the lists, newest first.
* ``/v1/jobs/{id}[/events|/result]`` and ``DELETE /v1/jobs/{id}`` go to the job's node on a
  control slot; an id the router has not seen is looked up on every node first (the router
  may have restarted), and one no node knows is 404 ``not_found``.
"""

from __future__ import annotations

import re
from typing import Any

from kcoral_server.jobs.job_listing import (
    LEFT_OUT_HEADER,
    LIMIT_PROBLEM,
    NODES_LEFT_OUT_HEADER,
    left_out_count,
    listing_limit,
)
from kcoral_server.router.auth import UNAUTHORIZED_MESSAGE, error_answer
from kcoral_server.router.forwarding.forward import ForwardHandler, ProgramForwardHandler
from kcoral_server.router.nodes.slot import CONTROL
from kcoral_server.router.routes.fan_out import (
    answer_while_nodes_reconnect,
    answers_to_merge,
    ask_every_node,
    error_kind,
    merged_answer,
    not_found_yet,
    sole_claims,
    untrusted_json,
    warn_contested,
)

JOB_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")


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


def job_owner(handler: Any, record: Any) -> str | None:
    """Whose a job record a node answered the caller is: its ``owner``, else the caller's;
    None for an owner the caller may not see: a node answers a caller only with jobs it may
    see, so that record is a rogue node's, to bind that identity's job to itself (ROUTER
    §13)."""
    owner = record.get("owner") if isinstance(record, dict) else None
    if not isinstance(owner, str):
        return handler.identity.name
    return owner if handler.identity.owns(owner) else None


def learn_submitted_job(handler: Any, body: bytes) -> bytes:
    """Remember the node of the job a 202 answer names (later requests for it go there),
    and the caller as its owner: the caller submitted it, whatever owner the answer names
    (a rogue node naming another identity's job got that identity's reads and cancels,
    ROUTER §13). The body passes unchanged."""
    document = untrusted_json(body)
    job_id = document.get("job_id") if isinstance(document, dict) else None
    if isinstance(job_id, str) and handler.node is not None:
        handler.state.jobs.remember(job_id, handler.node, handler.identity.name)
    return body


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
            if (owner := job_owner(self, job)) is not None
            and self.state.jobs.remember(job_id, node, owner)
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
    #: the owner a look-up found the job for, where it reached a node it is not bound to
    looked_up_owner: str | None = None

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
        owner = self.looked_up_owner or self.state.jobs.owner_of(self.path_args[0])
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
        not_held = 0  # the nodes that answered they do not (another identity's job too)
        owner = self.identity.name
        for node, answer, _headers in await ask_every_node(self, f"/v1/jobs/{job_id}"):
            if answer is None:
                continue
            status, body = answer
            if status == 200 and (claimed := job_owner(self, untrusted_json(body))) is not None:
                claims.append(node)
                owner = claimed
            elif status == 401:
                self.send_router_error(
                    401, "unauthorized", "missing or invalid bearer token", "request_rejected"
                )
                return None
            not_held += status == 404
            kind = error_kind(body)
            kinds.add(kind)
            if kind == "job_expired":
                expired = expiry_message(body)
        # A job lives on one node: when several claim it, one of them is lying (a rogue
        # node-token holder that learnt the id), and none is believed (ROUTER §13).
        if len(claims) == 1 and self.state.jobs.remember(job_id, claims[0], owner):
            return claims[0]
        if len(claims) == 1 and not self.state.jobs.visible_to(job_id, self.identity):
            # Who can reach what: the id is bound to another node for another identity (a
            # rogue's answer to bob's job, list or look-up named alice's id), and that
            # binding stays bob's; alice reaches the one node that claims the job for her,
            # unbound, each request looked up. Before, she read 404 for her own job until
            # bob's binding dropped; moved on her word, bob's binding to his honest node
            # could be taken by a rogue node claiming the id for a token holder it works with.
            self.looked_up_owner = owner
            return claims[0]
        if len(claims) > 1:
            nodes = ",".join(claims)
            self.state.log.event("job_claimed_twice", "WARNING", job=job_id, nodes=nodes)
        if "job_expired" in kinds:
            self.send_router_error(404, "job_expired", expired, "request_rejected")
        elif claims or not answer_while_nodes_reconnect(self, "job", not_held):
            self.send_router_error(404, "not_found", "job not found", "request_rejected")
        return None

    # Within the grace an unknown id is 503 "not found yet", while a job the router has
    # bound goes to its node, which answers another identity 404: that difference told a
    # holder of someone's job id that the job lives. Such a 404 reads as the unknown id's
    # answer, without the node's name (ROUTER §13). The owner of a job that went with a
    # server its node replaced is told so: "job not found" named no cause.
    def buffer_answer(self, status: int) -> bool:
        return status == 404  # small: read whole for ``rewrite``

    def rewrite(self, status: int, body: bytes) -> bytes:
        # its owner's (or an admin's) alone: the node it was sent to, back since, said so
        lost, message = self._lost(), not_found_yet(self, "job", not_held_by=1)
        if status != 404 or error_kind(body) != "not_found":
            return body
        if not lost:
            self._disowned()
        if not (lost or message):
            return body
        self.clear()
        if lost:
            message = f"job lost: its node {self.node} restarted its server, which held it"
            return error_answer(self, self.request_id, 404, "not_found", message)
        return error_answer(self, self.request_id, 503, "no_node", str(message))

    def _lost(self) -> bool:
        jobs, job_id = self.state.jobs, self.path_args[0]
        return jobs.visible_to(job_id, self.identity) and jobs.lost(job_id, self.node)

    def _disowned(self) -> None:
        """The node the job is bound to answered its owner (or an admin) that it holds no
        such job: the binding goes, and the next request looks the id up on every node. A
        rogue node that claimed alice's job to her look-up while her node was away, then
        answered her 404, kept her reading 404 until the binding dropped, her node back
        and holding the job (ROUTER §13). Who can reach what: only the bound node's own
        answer to the job's owner drops it, so no node can drop another node's binding."""
        jobs, job_id = self.state.jobs, self.path_args[0]
        if jobs.visible_to(job_id, self.identity) and jobs.node_of(job_id) == self.node:
            jobs.forget(job_id)
