"""The router's gauges per node and per kind (``kcoral_server.metrics.router_metrics``), read
from a real ``Registry`` holding more nodes and kinds than the metrics name: the ones past the
bound are summed under ``other``, so no sample repeats in the exposition (Prometheus refuses a
scrape's repeated samples)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.request import urlopen

from kcoral_server.metrics.labels import MAX_NAMED_KINDS, MAX_NAMED_NODES
from kcoral_server.metrics.router_metrics import RouterMetrics
from kcoral_server.router.nodes.registry import READY, NodeRecord, Registry
from kcoral_server.router.settings import RouterSettings
from prometheus_client.parser import text_string_to_metric_families
from router_helpers import start_router


@dataclass
class Waiting:
    waiting: int = 0

    def queued_needs(self) -> list[tuple[dict[str, str], int | None]]:
        return []


@dataclass
class State:
    """What the gauges read of a ``RouterState``."""

    registry: Registry
    admission: Waiting
    in_progress: int = 0


def gauge_values(registry: Registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics = RouterMetrics()
    metrics._state = State(registry, Waiting())  # type: ignore[assignment]
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    }


def test_a_node_that_left_the_router_counts_no_workers_for_itself_or_its_kind() -> None:
    registry = Registry(RouterSettings())
    for node_id in ("a", "b"):
        registry.nodes[node_id] = NodeRecord(
            node_id, state=READY, kind="h100", worker_count=4, connected=True
        )
    registry._lose(registry.nodes["b"], 0.0)  # its record stays until it is forgotten
    values = gauge_values(registry)
    assert values[("kcoral_router_node_workers", (("node", "a"),))] == 4
    assert values[("kcoral_router_node_workers", (("node", "b"),))] == 0
    assert values[("kcoral_router_kind_workers", (("kind", "h100"),))] == 4
    assert values[("kcoral_router_node_state", (("node", "b"), ("state", "unhealthy")))] == 1


def test_nodes_and_kinds_past_the_named_ones_are_summed_under_other() -> None:
    registry = Registry(RouterSettings())
    count = MAX_NAMED_NODES + 10
    for i in range(count):
        node_id = f"n{i}"
        kind = f"k{i % (MAX_NAMED_KINDS + 5)}"
        registry.nodes[node_id] = NodeRecord(
            node_id, state=READY, kind=kind, worker_count=2, connected=True
        )
    metrics = RouterMetrics()
    metrics._state = State(registry, Waiting())  # type: ignore[assignment]
    text = metrics.exposition().decode()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in seen, key
            seen.add(key)
            values[key] = sample.value
    assert values[("kcoral_router_node_state", (("node", "other"), ("state", "ready")))] == 10
    assert values[("kcoral_router_node_workers", (("node", "other"),))] == 20
    assert values[("kcoral_router_node_state", (("node", "n0"), ("state", "ready")))] == 1
    nodes_per_kind = {
        dict(labels)["kind"]: value
        for (name, labels), value in values.items()
        if name == "kcoral_router_kind_nodes"
    }
    assert len(nodes_per_kind) == MAX_NAMED_KINDS + 1 and "other" in nodes_per_kind
    assert sum(nodes_per_kind.values()) == count


def test_the_router_capacity_metric_says_it_counts_busy_slots_too_as_health_does(
    tmp_path: Path,
) -> None:
    """``registry.capacity()`` is /health's ``request_capacity``: busy and idle slots (ROUTER
    §9). Its help text said "idle worker slots", so a reader took a busy fleet for a full one."""
    router = start_router(tmp_path)
    try:
        with urlopen(router.url + "/metrics", timeout=30) as answer:  # loopback: no token needed
            text = answer.read().decode()
    finally:
        router.stop()
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "kcoral_router_request_capacity"
    ]
    assert "busy and idle" in family.documentation, family.documentation
