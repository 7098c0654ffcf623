"""Which nodes a request may go to (ROUTER §6, §7, §13; EXTENSIONS §14), and what the
fleet offers (``/v1/info``'s ``fleet`` and ``fleet_status``, ROUTER §6).

A request's ``X-KCoral-Select`` selector (``kcoral.protocol.selector``) is matched against
what each node offers: its operator's labels and the built-in keys ``gpu`` (its kind),
``arch``, ``gpus`` (its GPU count; ``gpus=N`` means at least N) and ``node`` (its id). A
request without a selector goes to the default kind, as every published client's always
did. The router consumes the header: nodes never see it (``headers.NOT_FORWARDED``).

Who can reach what: a selector only narrows the nodes the scheduler would pick anyway, so
it opens nothing a request without one could not reach; it never moves a session
(``selector_fits_session``), and it is caller input, so it is parsed (bounded: 512
characters, 16 keys) before anything else reads it and only its canonical form is logged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kcoral.protocol.multipart import boundary_from_content_type
from kcoral.protocol.selector import (
    Selector,
    format_selector,
    offers,
    selector_matches,
    session_mismatch,
)
from kcoral.protocol.strict_json import loads_strict
from kcoral_server.node.control_slots import CEILING

if TYPE_CHECKING:
    from kcoral_server.router.nodes.registry import NodeRecord, Registry

#: At most this many offers are named in a ``no_matching_node`` message.
MAX_NAMED_OFFERS = 24
#: ``registry.READY`` (the registry imports this module, so the word is spelled here too).
_READY = "ready"
#: ``slot.CONTROL`` (spelled here for the same reason)
_CONTROL = "control"


def ready_nodes(registry: Registry) -> list[NodeRecord]:
    """The connected ``ready`` nodes: the fleet that selectors, ``fleet`` and the metrics
    describe."""
    return [n for n in registry.nodes.values() if n.connected and n.state == _READY]


def node_offers(node: NodeRecord) -> dict[str, str]:
    """What ``node`` offers a selector: its labels and the built-in keys (a published
    supervisor's node reports no kind: it offers no ``gpu``/``arch``)."""
    return offers(node.labels, gpu=node.kind, arch=node.arch, gpus=node.gpus, node=node.node_id)


def serves(node: NodeRecord, selector: Selector, default_kind: str | None) -> bool:
    """Whether a request with ``selector`` may go to ``node``: without one, only nodes of
    the default kind (ROUTER §6); with one, exactly the nodes that match it."""
    if not selector:
        return node.kind == default_kind
    return selector_matches(selector, node_offers(node))


def has_gpus(node: NodeRecord, gpu_count: int | None) -> bool:
    """Whether ``node`` can hold a session or program of ``gpu_count`` GPUs (ROUTER §7,
    §13). A node of a published supervisor reports no count: it is not filtered."""
    return gpu_count is None or not node.kind or node.gpus >= gpu_count


#: The most of a program's body the router holds to read its ``options.gpu_count``.
PROGRAM_PEEK_LIMIT = 1 << 16
#: ``program_gpu_count``'s answer while the program part is not whole yet.
MORE = "more"


def program_gpu_count(start: bytes, content_type: str | None) -> int | str | None:
    """The ``options.gpu_count`` of the program at the ``start`` of an ``/execute`` body
    (PROTOCOL §3.1: our clients send the ``program`` part first), ``MORE`` while that part
    is not whole, or None: no count, or a body the router cannot read that way (its node
    answers it as before)."""
    try:
        boundary = boundary_from_content_type(content_type)
    except ValueError:  # ValidationError
        return None
    opening = b"--" + boundary + b"\r\n"
    if not start.startswith(opening):
        return MORE if opening.startswith(start) else None
    head_end = start.find(b"\r\n\r\n", len(opening))
    if head_end < 0:
        return MORE
    if b'name="program"' not in start[len(opening) : head_end]:
        return None
    end = start.find(b"\r\n--" + boundary, head_end + 4)
    if end < 0:
        return MORE
    try:
        program = loads_strict(start[head_end + 4 : end])
    except (ValueError, RecursionError, TypeError):
        return None
    options = program.get("options") if isinstance(program, dict) else None
    count = options.get("gpu_count") if isinstance(options, dict) else None
    return count if type(count) is int and count >= 1 else None


def seatable_gpu_count(registry: Registry, selector: Selector, gpu_count: int | None) -> int | None:
    """The GPU count a program's nodes are filtered by (ROUTER §7): its ``gpu_count`` when a
    connected node it may go to has that many GPUs (ready or not: a busy or recovering one
    comes back); else None, unfiltered, and the node's own ``400`` says how many it has."""
    if gpu_count is None:
        return None
    default = registry.default_kind
    return (
        gpu_count
        if any(
            n.connected and serves(n, selector, default) and has_gpus(n, gpu_count)
            for n in registry.nodes.values()
        )
        else None
    )


def offering_nodes(registry: Registry, selector: Selector) -> list[NodeRecord]:
    """The connected ``ready`` nodes a request with ``selector`` may go to, busy or not."""
    default = registry.default_kind
    return [n for n in ready_nodes(registry) if serves(n, selector, default)]


def waiters_by_selector(
    nodes: Sequence[NodeRecord],
    queued: Iterable[tuple[Selector, int | None]],
    default_kind: str | None,
) -> list[tuple[frozenset[str], int]]:
    """The waiters ``queued`` (each one's selector, ``{}`` for the default kind, and the GPUs
    its program asks for) grouped by what they need: the ids of the ``nodes`` each may go
    to, and how many waiters need it. Each distinct need is matched once (a full queue holds
    up to --max-queued-requests waiters, read at every ``/v1/info`` and scrape)."""
    counts: Counter[tuple[str, int | None]] = Counter()
    selectors: dict[str, Selector] = {}
    for selector, gpu_count in queued:
        key = format_selector(selector)
        counts[(key, gpu_count)] += 1
        selectors.setdefault(key, selector)
    return [
        (
            frozenset(
                n.node_id
                for n in nodes
                if serves(n, selectors[key], default_kind) and has_gpus(n, gpu_count)
            ),
            count,
        )
        for (key, gpu_count), count in counts.items()
    ]


def session_nodes(
    registry: Registry, selector: Selector, gpu_count: int | None
) -> list[NodeRecord]:
    """The nodes a new session of ``gpu_count`` GPUs may go to (ROUTER §13): of those that
    fit ``selector``, the ones with enough GPUs; when none has enough, the ones with the
    most, whose own ``400`` then says how many it has (as before nodes reported counts)."""
    nodes = offering_nodes(registry, selector)
    enough = [n for n in nodes if has_gpus(n, gpu_count)]
    if enough or not nodes:
        return enough
    most = max(n.gpus for n in nodes)
    return [n for n in nodes if n.gpus == most]


def fleet_offers(nodes: Iterable[NodeRecord]) -> str:
    """What ready nodes offer, in selector words: ``gpu=a100: 1 node, gpu=h100: 2 nodes``,
    then the labels (``pool=big: 1 node``); bounded."""
    kinds: dict[str, int] = {}
    labels: dict[str, int] = {}
    for node in nodes:
        kind = f"gpu={node.kind},gpus={node.gpus}" if node.kind else "a node of no kind"
        kinds[kind] = kinds.get(kind, 0) + 1
        for key, value in node.labels.items():
            labels[f"{key}={value}"] = labels.get(f"{key}={value}", 0) + 1
    entries = [*sorted(kinds.items()), *sorted(labels.items())]
    if not entries:
        return "the fleet has no ready node"
    named = [f"{what}: {count} node{'s' if count != 1 else ''}" for what, count in entries]
    if len(named) > MAX_NAMED_OFFERS:
        named = [*named[:MAX_NAMED_OFFERS], f"and {len(named) - MAX_NAMED_OFFERS} more"]
    return "the fleet offers " + ", ".join(named)


def no_match_message(registry: Registry, selector: Selector) -> str:
    """The ``503 no_matching_node`` message: what was asked and what the fleet offers."""
    offers = fleet_offers(ready_nodes(registry))
    return f"no ready node offers the selector {format_selector(selector)}; {offers}"


def selector_fits_session(node: NodeRecord | None, selector: Selector) -> str | None:
    """The ``409 selector_mismatch`` message for a program of a session on ``node`` whose
    selector that node does not fit, or None (it fits, or there is no selector)."""
    if not selector or (node is not None and selector_matches(selector, node_offers(node))):
        return None
    where = f"node {node.node_id}" if node is not None else "its node"
    return session_mismatch(where, selector)


def fleet(registry: Registry) -> dict[str, list[dict[str, Any]]]:
    """``/v1/info``'s ``fleet`` (ROUTER §6): the ``ready`` nodes counted by kind and by
    label, the default kind first."""
    kinds: dict[tuple[str, str, int], int] = {}
    labels: dict[tuple[str, str], int] = {}
    for n in ready_nodes(registry):
        key = (n.kind, n.arch, n.gpus)
        kinds[key] = kinds.get(key, 0) + 1
        for label in n.labels.items():
            labels[label] = labels.get(label, 0) + 1
    default = registry.default_kind
    return {
        "kinds": [
            {
                "gpu": gpu or None,
                "arch": arch or None,
                "gpus": gpus,
                "nodes": count,
                "default": gpu == default,
            }
            for (gpu, arch, gpus), count in sorted(
                kinds.items(), key=lambda i: (i[0][0] != default, i[0])
            )
        ],
        "labels": [
            {"key": k, "value": v, "nodes": count} for (k, v), count in sorted(labels.items())
        ],
    }


def fleet_status(
    registry: Registry, queued: Sequence[tuple[Selector, int | None]] = ()
) -> dict[str, list[dict[str, Any]]]:
    """``/v1/info``'s ``fleet_status`` (ROUTER §6): ``fleet``'s rows with what they hold now.

    Per kind and per label of the ``ready`` nodes: ``seats`` (their worker slots),
    ``free_seats`` (``NodeRecord.free_seats``: idle slots whose seat is idle), ``queued``
    (requests waiting at the router that a node of the row could serve — ``queued`` holds
    each waiter's selector, ``{}`` for the default kind, and its program's GPU count — plus
    those waiting in the nodes' own pools), ``recent_programs`` (the nodes' reported count)
    and ``estimated_wait_seconds``: an estimate, ``(queued + 1 -
    free_seats) / seats`` times the mean time a recent program held its seat, at least 0,
    ``None`` without recent programs."""
    default = registry.default_kind
    ready = ready_nodes(registry)
    kinds: dict[tuple[str, str, int], list[NodeRecord]] = {}
    labels: dict[tuple[str, str], list[NodeRecord]] = {}
    for n in ready:
        kinds.setdefault((n.kind, n.arch, n.gpus), []).append(n)
        for label in n.labels.items():
            labels.setdefault(label, []).append(n)

    wanted = waiters_by_selector(ready, queued, default)

    def load(nodes: list[NodeRecord]) -> dict[str, Any]:
        seats = sum(len(n.current_slots()) for n in nodes)
        free = sum(n.free_seats() for n in nodes)
        stats = [n.lease_stats for n in nodes if n.lease_stats is not None]
        ids = {n.node_id for n in nodes}
        waiting = sum(count for served, count in wanted if served & ids)
        waiting += sum(s.queued for s in stats)
        count = sum(s.count for s in stats)
        estimate = None
        if count and seats:
            held_ms = sum(s.count * s.seat_held_mean_ms for s in stats) / count
            estimate = round(max(0, waiting + 1 - free) / seats * held_ms / 1000.0, 3)
        return {
            "nodes": len(nodes),
            "seats": seats,
            "free_seats": free,
            "queued": waiting,
            "recent_programs": count,
            "estimated_wait_seconds": estimate,
        }

    return {
        "kinds": [
            {"gpu": gpu or None, "arch": arch or None, "gpus": gpus, "default": gpu == default}
            | load(nodes)
            for (gpu, arch, gpus), nodes in sorted(
                kinds.items(), key=lambda i: (i[0][0] != default, i[0])
            )
        ],
        "labels": [
            {"key": key, "value": value} | load(nodes)
            for (key, value), nodes in sorted(labels.items())
        ],
        "not_ready": not_ready_kinds(registry),
    }


def not_ready_kinds(registry: Registry) -> list[dict[str, Any]]:
    """``fleet_status``'s ``not_ready`` (ROUTER §6): per kind, the node records the router
    keeps that are not ``ready``, counted by state (``{"draining": 1}``), so a node that
    drains or goes quiet shows as such, not as a smaller fleet. Each record's state is the
    router's reading of that node's own stream: a node moves only its own count."""
    default = registry.default_kind
    ready = {id(n) for n in ready_nodes(registry)}
    kinds: dict[tuple[str, str, int], dict[str, int]] = {}
    for n in registry.nodes.values():
        if id(n) in ready:
            continue
        counts = kinds.setdefault((n.kind, n.arch, n.gpus), {})
        counts[n.state] = counts.get(n.state, 0) + 1
    return [
        {"gpu": gpu or None, "arch": arch or None, "gpus": gpus, "default": gpu == default}
        | {"states": dict(sorted(states.items()))}
        for (gpu, arch, gpus), states in sorted(
            kinds.items(), key=lambda i: (i[0][0] != default, i[0])
        )
    ]


# -- each identity's share of a node's long-held control slots (ROUTER §7) ----------------
#
# A request that holds its control slot for as long as its caller likes (an event stream, a
# session's program, a result read at the caller's pace) never takes a node's last free
# control slot, but one client-token holder could take all the others: bob's event streams
# held 63 of a node's 64, and alice's streams waited for his to end (her ``kcoral run``,
# which asks the server to cancel a job nobody follows, could lose its job meanwhile). With
# two or more identities in the client token file, one identity holds at most half of a
# node's control-slot ceiling in long-held requests; past it, its request waits for one of
# its own to end, while other identities' are served.


@dataclass(frozen=True)
class LongHold:
    """A request that holds its control slot long, for ``holder`` (its identity);
    ``capped``: identities share (two or more), so it stays within ``holder``'s share."""

    holder: str
    capped: bool


def control_ceiling(node: NodeRecord) -> int:
    """The most control slots ``node`` opens, as its slots' hellos say (it opens more as they
    fill; ``KCORAL_NODE_CONTROL_SLOTS`` fixes fewer), or what it has where more. A published
    node does not say: the nodes' own ceiling, 64, is taken, as before. Before, every node
    was taken to grow to 64, and one identity's streams held all but the last of a node's 6
    fixed slots, however many identities shared them. A node-token holder that says more
    than it opens only weakens the share on its own node."""
    current = node.current_slots(_CONTROL)
    said = max((slot.control_ceiling for slot in current), default=0)
    return max(said or CEILING, len(current))


def long_held(node: NodeRecord, identity: str) -> int:
    """Control slots of ``node`` that ``identity``'s long-held requests hold now."""
    return sum(
        1
        for slot in node.slots.values()
        if slot.kind == _CONTROL
        and slot.busy
        and slot.long_holder == identity
        and not slot.closed.is_set()
    )


def within_share(node: NodeRecord, long: LongHold) -> bool:
    """Whether ``long`` may take a control slot of ``node``: at most half its ceiling,
    rounded up, for one identity where identities share."""
    return not long.capped or long_held(node, long.holder) < -(-control_ceiling(node) // 2)


def share_held_message(node: NodeRecord, identity: str) -> str:
    return (
        f"you hold {long_held(node, identity)} event streams, session programs or result "
        f"reads on node {node.node_id}, the most one identity may (half of its "
        f"{control_ceiling(node)} control slots); this request waited for one of them to end "
        "until the queue wait ran out"
    )
