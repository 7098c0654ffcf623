"""A node's ``draining`` (ROUTER §6) takes only that node out: a rogue node (any holder of
the node token) that claims it, drops it, and claims it again changes its own record alone;
the honest node beside it stays ``ready`` and eligible throughout, and the rogue's
``draining`` -> ``starting`` path (a server that drained alone, restarted by its
supervisor) is no failure of anyone else's."""

from __future__ import annotations

import time

from kcoral_server.router.nodes.registry import SERVER_STARTING, eligible
from test_router_units import add_node, make_registry, status


def test_a_rogue_node_claiming_draining_takes_only_itself_out() -> None:
    registry = make_registry(unhealthy_threshold=1, recovery_threshold=3)
    add_node(registry, "honest")
    add_node(registry, "rogue")
    rogue = registry.nodes["rogue"]
    assert rogue.stream is not None
    for _ in range(3):
        registry.apply_status(rogue.stream, status("rogue", draining=True))  # healthy, says so
        assert rogue.state == "draining"
        starting = status("rogue", healthy=False, last_error=SERVER_STARTING)
        registry.apply_status(rogue.stream, starting)
        assert rogue.state == "starting"
        registry.apply_status(rogue.stream, status("rogue"))
        assert rogue.state == "ready"
        honest = registry.nodes["honest"]
        assert honest.state == "ready" and honest.failures == 0
        assert eligible(honest, time.monotonic(), registry.default_kind)
    registry.apply_status(rogue.stream, status("rogue", draining=True))
    assert eligible(registry.nodes["honest"], time.monotonic(), registry.default_kind)
    assert not eligible(rogue, time.monotonic(), registry.default_kind)
