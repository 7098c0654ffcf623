"""A server's own answer to a selector (EXTENSIONS §14): what it offers, and the refusal of a
request whose ``X-KCoral-Select`` it does not fit.

A direct server matches a selector against itself — its kind (``gpu``: the short key of
``kcoral_server.gpu.kind``, ``cpu`` for a CPU server), ``arch``, ``gpus`` (its GPU count),
``node`` (its node id, when it is a router's node) and its ``--node-label`` labels — and
answers ``503 no_matching_node`` when it does not fit, instead of running the program
quietly somewhere it was not meant to run. A session's program that its session's server
does not fit gets ``409 selector_mismatch`` (the session cannot move). Behind a router the
header never arrives: the router chose a node that fits and keeps the header to itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kcoral.protocol.selector import (
    BUILT_IN_KEYS,
    INVALID_SELECTOR,
    NO_MATCHING_NODE,
    SELECTOR_MISMATCH,
    SelectorError,
    format_selector,
    header_selector,
    offers,
    selector_matches,
    session_mismatch,
)
from kcoral_server.execution.responses import Refusal
from kcoral_server.gpu.kind import describe_node
from kcoral_server.settings.config import node_labels

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState

#: What the event log says of a malformed selector: the caller's text is never logged.
SELECTOR_NOT_LOGGED = "malformed X-KCoral-Select header (its text is not logged)"


def describe_offers(state: ServerState) -> dict[str, str]:
    """What this server offers a selector (the GPU probe of ``describe_node`` runs here on a
    GPU server: NVML or ``nvidia-smi``, never torch)."""
    kind = describe_node(state.mode, state.gpus)
    return offers(
        node_labels(state.config),
        gpu=kind.gpu,
        arch=kind.arch,
        gpus=state.gpu_count,
        node=state.config.node_id or "",
    )


def server_offers(state: ServerState) -> dict[str, str]:
    """``describe_offers``, found once per server (``ServerState.start`` finds it early)."""
    if state.offers is None:
        state.offers = describe_offers(state)
    return state.offers


def offers_text(offered: dict[str, str]) -> str:
    """``gpu=cpu, gpus=0, pool=big``: the built-in keys first, then the labels."""
    built_in = [k for k in BUILT_IN_KEYS if k in offered]
    labels = sorted(k for k in offered if k not in built_in)
    return ", ".join(f"{key}={offered[key]}" for key in [*built_in, *labels])


def selector_refusal(
    state: ServerState, values: Sequence[str], *, in_session: bool = False
) -> Refusal | None:
    """The refusal of a request whose ``X-KCoral-Select`` header ``values`` are malformed
    (400) or that this server does not fit (503; 409 for a program of a session), or None."""
    try:
        selector = header_selector(values)
    except SelectorError as exc:
        return Refusal(400, INVALID_SELECTOR, str(exc), "rejected")
    if not selector:
        return None  # no selector: nothing to match (and no probe on the loop)
    offered = server_offers(state)
    if selector_matches(selector, offered):
        return None
    if in_session:
        message = f"{session_mismatch('this server', selector)} (it offers {offers_text(offered)})"
        return Refusal(409, SELECTOR_MISMATCH, message, "rejected")
    message = (
        f"this server does not fit the selector {format_selector(selector)}: it offers "
        f"{offers_text(offered)}"
    )
    return Refusal(503, NO_MATCHING_NODE, message, "rejected")


def logged(refusal: Refusal) -> Refusal:
    """``refusal`` as the event log may record it: a malformed selector's message (which
    quotes the caller's text) is replaced."""
    if refusal.kind != INVALID_SELECTOR:
        return refusal
    return Refusal(refusal.status, refusal.kind, SELECTOR_NOT_LOGGED, refusal.reason)
