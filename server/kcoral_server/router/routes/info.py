"""``GET /v1/info`` through the router: any ready node's answer, with what the router adds (its
token, the sessions feature, the fleet and its status, ROUTER §6) and without that node's own
counts."""

from __future__ import annotations

from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.router.admission.selection import fleet, fleet_status
from kcoral_server.router.forwarding.forward import ForwardHandler
from kcoral_server.router.nodes.slot import CONTROL
from kcoral_server.router.routes.fan_out import untrusted_json

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
        self.state.fleet_limits.learn(self.state.registry, self.node, info)
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
        # ``limits`` are the answering node's; a body over this is refused wherever it goes
        router_limit = self.state.settings.max_request_bytes
        info["fleet_limits"] = self.state.fleet_limits.describe(self.state.registry, router_limit)
        return dumps_compact(info)
