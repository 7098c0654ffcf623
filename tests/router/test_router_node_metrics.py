"""A node's own metrics reach its router's ``/metrics`` up the supervisor stream (issue 33.4,
EXTENSIONS §13): a real router, a real CPU node (supervisor and child server) and an
in-process fake node of another kind. The node's server series appear with the router's
``node`` and ``kind`` labels, the router's own series are counted per kind too, and a node
that leaves takes its series with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from node_metrics_support import MetricsNode, matching, router_samples, wait_for_samples
from raw_http import call_program, post_execute
from router_helpers import Node, ready_nodes, start_router, stopping

pytestmark = pytest.mark.slow


def test_a_nodes_server_series_and_the_routers_per_kind_series_show_at_the_router(
    tmp_path: Path,
) -> None:
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, router, "cpu-m", None, "--metrics-interval-seconds", "0.5")
    with stopping(router, [node]):
        ready_nodes(router, 1)
        for _ in range(2):
            answer = post_execute(router.url, call_program("def main():\n    return 1\n"))
            assert answer.status == 200
        # The node's own count of the two programs, as its server counted them, labelled by
        # the router with the node's id and kind.
        samples = wait_for_samples(
            router.url,
            lambda s: any(
                x.value >= 2
                for x in matching(s, "kcoral_requests_total", node="cpu-m", reason="completed")
            ),
            "the node's kcoral_requests_total",
        )
        (completed,) = matching(samples, "kcoral_requests_total", node="cpu-m", status="200")
        assert completed.labels["kind"] == "cpu" and completed.labels["error_kind"] == "none"
        assert matching(samples, "kcoral_request_capacity", node="cpu-m", kind="cpu")
        assert (
            matching(samples, "kcoral_router_kind_routed_requests_total", kind="cpu")[0].value >= 2
        )
        assert matching(samples, "kcoral_router_node_info", node="cpu-m", kind="cpu")
        assert (
            matching(samples, "kcoral_router_kind_nodes", kind="cpu", state="ready")[0].value == 1
        )
        assert matching(samples, "kcoral_router_kind_workers", kind="cpu")[0].value >= 1
        assert matching(samples, "kcoral_router_kind_queue_wait_seconds_count", kind="cpu")
        assert matching(samples, "kcoral_router_node_queue_wait_seconds_count", node="cpu-m")

        async def another_kind() -> None:
            # a node of another kind that sends no metrics text
            fake = MetricsNode(router.port, "h100-fake", slots=2, gpu="h100", gpus=2)
            await fake.start()
            try:
                seen = await asyncio.to_thread(
                    wait_for_samples,
                    router.url,
                    lambda s: matching(s, "kcoral_router_kind_workers", kind="h100"),
                    "the h100 kind",
                )
                (workers,) = matching(seen, "kcoral_router_kind_workers", kind="h100")
                assert workers.value == 2
                assert not matching(seen, "kcoral_requests_total", node="h100-fake")
            finally:
                await fake.close()

        asyncio.run(another_kind())
        node.stop()
        # Gone from the router: its own series go with it; the router's count stays.
        after = wait_for_samples(
            router.url,
            lambda s: not matching(s, "kcoral_requests_total", node="cpu-m"),
            "the node's series gone",
        )
        assert matching(after, "kcoral_router_routed_requests_total", node="cpu-m")
    assert "node_metrics_unavailable" not in node.log_path.read_text()


def test_a_node_with_metrics_off_sends_none(tmp_path: Path) -> None:
    router = start_router(tmp_path)
    node = Node(tmp_path, router, "cpu-q", None, "--metrics-interval-seconds", "0")
    with stopping(router, [node]):
        ready_nodes(router, 1)
        assert post_execute(router.url, call_program("def main():\n    return 1\n")).status == 200
        samples = router_samples(router.url)
        assert matching(samples, "kcoral_router_node_info", node="cpu-q")
        assert not [
            s for s in samples if s.labels.get("node") == "cpu-q" and "router" not in s.name
        ]
