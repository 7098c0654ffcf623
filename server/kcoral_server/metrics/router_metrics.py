"""A router's own Prometheus metrics (EXTENSIONS §13), in a registry of its own.

As on a server, counters and histograms come from the log: ``RouterMetrics.record`` listens to
every ``RouterLog`` line (``request_finished`` carries the node, status, finish reason, queue
wait and duration), and gauges (each node's state, busy slots and workers; the queue) are read
from the router's registry at the scrape. Labels: ``kcoral_server.metrics.labels``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kcoral_server.metrics.labels import (
    NODE_STATES,
    ROUTER_FINISH_REASONS,
    TUNNEL_ERRORS,
    NodeLabels,
    endpoint_of,
    one_of,
    status_label,
)
from kcoral_server.metrics.server_metrics import SECONDS_BUCKETS

if TYPE_CHECKING:
    from kcoral_server.router.http_app import RouterState


class RouterGauges(Collector):
    """Per-node and queue gauges read from the router's state at each scrape."""

    def __init__(self, read: Callable[[], RouterState | None], nodes: NodeLabels) -> None:
        self._read = read
        self._nodes = nodes

    def collect(self) -> Iterator[Metric]:
        state = self._read()
        if state is None:
            return
        registry = state.registry
        for name, documentation, value in (
            ("kcoral_router_queue_depth", "requests waiting for a node", state.admission.waiting),
            ("kcoral_router_requests_in_progress", "requests on a node", state.in_progress),
            ("kcoral_router_request_capacity", "idle worker slots", registry.capacity()),
        ):
            yield GaugeMetricFamily(name, documentation, value=float(value))
        node_state = GaugeMetricFamily(
            "kcoral_router_node_state", "1 for each node's current state", labels=["node", "state"]
        )
        busy = GaugeMetricFamily(
            "kcoral_router_node_busy", "requests on each node's worker slots", labels=["node"]
        )
        workers = GaugeMetricFamily(
            "kcoral_router_node_workers", "workers each node reports", labels=["node"]
        )
        for node in list(registry.nodes.values()):
            label = self._nodes(node.node_id)
            node_state.add_metric([label, one_of(node.state, NODE_STATES)], 1.0)
            busy.add_metric([label], float(node.inflight()))
            workers.add_metric([label], float(node.worker_count))
        yield node_state
        yield busy
        yield workers


class RouterMetrics:
    """One router's metrics. ``record`` is the ``RouterLog`` listener."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._state: RouterState | None = None
        self._nodes = NodeLabels()
        registry = self.registry
        self.requests = Counter(
            "kcoral_router_requests",
            "requests the router finished, by HTTP status and finish reason",
            ["status", "reason"],
            registry=registry,
        )
        self.routed = Counter(
            "kcoral_router_routed_requests",
            "requests the router sent to a node",
            ["node"],
            registry=registry,
        )
        self.tunnel_errors = Counter(
            "kcoral_router_tunnel_errors",
            "requests whose tunnel to a node failed",
            ["node"],
            registry=registry,
        )
        self.duration = Histogram(
            "kcoral_router_request_duration_seconds",
            "request duration at the router, by endpoint",
            ["endpoint"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "kcoral_router_queue_wait_seconds",
            "time a routed request waited for a node",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        registry.register(RouterGauges(lambda: self._state, self._nodes))

    def attach(self, state: RouterState) -> None:
        self._state = state
        state.log.add_listener(self.record)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def record(self, event: str, fields: dict[str, Any]) -> None:
        if event != "request_finished":
            return
        reason = one_of(fields.get("finish_reason"), ROUTER_FINISH_REASONS)
        self.requests.labels(status_label(fields.get("http_status")), reason).inc()
        duration = fields.get("duration_ms")
        if isinstance(duration, (int, float)):
            endpoint = endpoint_of(fields.get("path"))
            self.duration.labels(endpoint).observe(max(0.0, duration / 1000.0))
        node = fields.get("node")
        if node is None:
            return  # never reached a node
        label = self._nodes(node)
        self.routed.labels(label).inc()
        if reason in TUNNEL_ERRORS:
            self.tunnel_errors.labels(label).inc()
        wait = fields.get("queue_wait_ms")
        if isinstance(wait, (int, float)):
            self.queue_wait.observe(max(0.0, wait / 1000.0))
