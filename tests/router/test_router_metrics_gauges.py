"""The router's gauges per node and per kind (``kcoral_server.metrics.router_metrics``), read
from a real ``Registry`` holding more nodes and kinds than the metrics name: the ones past the
bound are summed under ``other``, so no sample repeats in the exposition (Prometheus refuses a
scrape's repeated samples)."""

from __future__ import annotations

from dataclasses import dataclass

from kcoral_server.metrics.labels import MAX_NAMED_KINDS, MAX_NAMED_NODES
from kcoral_server.metrics.router_metrics import RouterMetrics
from kcoral_server.router.registry import READY, NodeRecord, Registry
from kcoral_server.router.settings import RouterSettings
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Waiting:
    waiting: int = 0

    def queued_selectors(self) -> list[dict[str, str]]:
        return []


@dataclass
class State:
    """What the gauges read of a ``RouterState``."""

    registry: Registry
    admission: Waiting
    in_progress: int = 0


def test_nodes_and_kinds_past_the_named_ones_are_summed_under_other() -> None:
    registry = Registry(RouterSettings())
    count = MAX_NAMED_NODES + 10
    for i in range(count):
        node_id = f"n{i}"
        kind = f"k{i % (MAX_NAMED_KINDS + 5)}"
        registry.nodes[node_id] = NodeRecord(node_id, state=READY, kind=kind, worker_count=2)
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
