"""A router names at most ``MAX_NAMED_NODES`` node ids in its metrics at once (EXTENSIONS
§13), and a node whose record the router forgot (ROUTER §6's retention) gives its name back,
series and all. Before, the first ids took the names for the router's whole life: on a
fleet whose node ids change (the Slurm script puts the job id in its node's), every node
after the 256th read as ``other`` and its own series were not relayed at all, while each
gone node's counters stayed in every scrape. Here the bound is 1, with a real router in
this process and fake nodes on its gRPC port."""

from __future__ import annotations

import asyncio

import pytest
from kcoral_server.metrics import router_metrics
from node_metrics_support import MetricsNode
from router_helpers import FakeNode, http_request, in_process_router


def test_a_forgotten_node_gives_its_name_and_series_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(router_metrics, "MAX_NAMED_NODES", 1)

    async def scenario() -> tuple[str, str]:
        args = ["--max-status-age-seconds", "1", "--node-retention-seconds", "2"]
        async with in_process_router(*args) as router:
            state, grpc_port, port = router.state, router.grpc_port, router.port
            first = FakeNode(grpc_port, "slurm-4711-gpu07")
            await first.start()
            while state.registry.capacity() < 1:
                await asyncio.sleep(0.05)
            answer = await http_request(port, "POST", "/execute", b"{}")
            assert answer.status == 200, answer.body  # the fake node echoes it
            before = state.metrics.exposition().decode()
            await first.close()  # its job ended; its record is forgotten after retention
            for _ in range(400):
                state.registry.check()
                if "slurm-4711-gpu07" not in state.registry.nodes:
                    break
                await asyncio.sleep(0.05)
            second = FakeNode(grpc_port, "slurm-4712-gpu07")
            await second.start()
            try:
                while state.registry.capacity() < 1:
                    await asyncio.sleep(0.05)
                return before, state.metrics.exposition().decode()
            finally:
                await second.close()

    before, after = asyncio.run(scenario())
    assert 'kcoral_router_routed_requests_total{node="slurm-4711-gpu07"} 1.0' in before, before
    assert 'kcoral_router_node_info{kind="none",node="slurm-4712-gpu07"} 1.0' in after, after
    assert 'node="other"' not in after, after
    assert "slurm-4711-gpu07" not in after, after


def test_a_kind_no_known_node_has_gives_its_name_and_series_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rogue node holding the node token reported a new kind in each status (or under each
    new node id): each took one of the 64 kind names for the router's whole life, so every
    kind that came later, a real new GPU kind of the fleet, read as ``other`` in every
    per-kind series and in its nodes' relayed ones. A kind no known node has gives its name
    back. Here the bound is 1."""
    monkeypatch.setattr(router_metrics, "MAX_NAMED_KINDS", 1)

    async def scenario() -> tuple[str, str]:
        async with in_process_router() as router:
            state, grpc_port, port = router.state, router.grpc_port, router.port
            rogue = MetricsNode(grpc_port, "rogue", gpu="rogue1")
            await rogue.start()
            try:
                while state.registry.capacity() < 1:
                    await asyncio.sleep(0.05)
                answer = await http_request(port, "POST", "/execute", b"{}")
                assert answer.status == 200, answer.body  # the fake node echoes it
                before = state.metrics.exposition().decode()
                rogue.gpu = "rogue2"  # its next status reports another kind
                while state.registry.nodes["rogue"].kind != "rogue2":
                    await asyncio.sleep(0.05)
                return before, state.metrics.exposition().decode()
            finally:
                await rogue.close()

    before, after = asyncio.run(scenario())
    assert 'kcoral_router_kind_routed_requests_total{kind="rogue1"} 1.0' in before, before
    assert 'kcoral_router_node_info{kind="rogue2",node="rogue"} 1.0' in after, after
    assert 'kind="other"' not in after, after
    assert "rogue1" not in after, after
