"""``/v1/info``'s ``fleet_limits`` (ROUTER §13): the largest request body the router passes on
that some ready node may take, so a client can refuse a larger one before sending it
(CLIENT_API §2.1 step 11). A node's own ``limits`` are one server's, and the router's
``/v1/info`` is any one node's answer."""

from __future__ import annotations

from typing import Any

from kcoral_server.router.admission.selection import ready_nodes
from kcoral_server.router.nodes.registry import Registry


class FleetLimits:
    """Each node's ``limits.max_request_bytes``, as its server's ``/v1/info`` said it (learnt
    from the answers the router reads anyway: a relayed ``/v1/info``, a session's choice of
    node), kept per server instance: a server's settings hold until it is replaced."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, int]] = {}  # node id -> (server instance, bytes)

    def learn(self, registry: Registry, node_id: str | None, info: Any) -> None:
        """``node_id``'s server answered ``/v1/info`` with ``info`` (untrusted JSON)."""
        node = registry.nodes.get(node_id) if node_id is not None else None
        limits = info.get("limits") if isinstance(info, dict) else None
        limit = limits.get("max_request_bytes") if isinstance(limits, dict) else None
        if node is None or not node.server_instance_id:
            return
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            self._known[node.node_id] = (node.server_instance_id, limit)
        else:  # a node that states none may take any size: it bounds nothing
            self._known.pop(node.node_id, None)

    def describe(self, registry: Registry, router_limit: int) -> dict[str, Any]:
        """``fleet_limits``: the router's own ``--max-request-bytes``, or the largest limit
        of the ready nodes where every one of them stated one and it is smaller. A body over
        it is refused wherever it goes; the largest, not the smallest, so a body some node
        takes is never held back (and a rogue node stating a tiny limit blocks nothing)."""
        limits: list[int] = []
        for node in ready_nodes(registry):
            known = self._known.get(node.node_id)
            if known is None or known[0] != node.server_instance_id:
                limits = []  # a node whose limit is unknown may take any size
                break
            limits.append(known[1])
        if limits and max(limits) < router_limit:
            return {"max_request_bytes": max(limits), "set_by": "nodes"}
        return {"max_request_bytes": router_limit, "set_by": "router"}
