"""Asking every node at once, and merging what they answer (``GET /v1/jobs``, ``GET /v1/sessions``
and look-ups of an id the router has not seen): a control slot a node, as the caller, each
answer collected whole and read as untrusted (a node-token holder wrote it), ids that several
nodes claim believed of none."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from kcoral.protocol.strict_json import dumps_compact, loads_strict
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.admission.scheduler import NoNode, RouterBusy
from kcoral_server.router.forwarding.forward import ForwardHandler
from kcoral_server.router.forwarding.headers import METHOD_HEADER, PATH_HEADER, identity_header
from kcoral_server.router.identity import MAX_FRAME_DATA
from kcoral_server.router.nodes.registry import NodeRecord
from kcoral_server.router.nodes.slot import SlotBroken

#: seconds one node may keep a list or look-up waiting for a slot, then for its answer: 20
#: in all, so the router answers (leaving such a node out) within the 30 s a client gives a
#: status read's whole answer (CLIENT_API §1). At 10 + 30 s, one frozen or rogue node made
#: every client's ``jobs()``, job look-up and session list through the router fail with
#: "no answer within 30.0 s", the router's answer still to come.
FAN_OUT_SLOT_WAIT = 5.0
FAN_OUT_ANSWER_WAIT = 15.0


MAX_FETCHED_BYTES = 64 << 20
#: one node's answer to a fan-out GET: its id, ``(status, body)`` (None: no answer in time)
#: and the answer's headers (lower-cased names)
NodeAnswer = tuple[str, tuple[int, bytes] | None, dict[str, str]]


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


def not_found_yet(handler: ForwardHandler, what: str, not_held_by: int = 0) -> str | None:
    """The 503 message for a ``what`` no connected node knows, within the router's first
    ``--reconnect-grace-seconds`` (else None): a node reconnects with a back-off of up to
    30 s (ROUTER §5), and until it has, the jobs and sessions it holds are unknown here, not
    gone (§13). Before, a router restart answered 404 there, and `kcoral run` gave up a job
    that went on running, with nobody left to watch or cancel it (jobs soak).
    ``not_held_by``: how many connected nodes have just answered that they do not hold it;
    where some have, its node may have come back with a new server, which lost it: "may not
    have reconnected" was then untrue (router mend)."""
    age = time.monotonic() - handler.state.started_monotonic
    if age >= handler.state.settings.reconnect_grace_seconds:
        return None
    started = f"{what} not found yet: the router started {age:.0f} s ago"
    if not_held_by < 1:
        return f"{started}, and the node that holds it may not have reconnected"
    held = (
        "the node back since does not hold it"
        if not_held_by == 1
        else f"none of the {not_held_by} nodes back since holds it"
    )
    return f"{started}, and {held}: its node has not reconnected yet, or restarted and lost it"


def answer_while_nodes_reconnect(handler: ForwardHandler, what: str, not_held_by: int) -> bool:
    """503 ``no_node`` ``not_found_yet`` within the grace; True: answered."""
    message = not_found_yet(handler, what, not_held_by)
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
