"""A router's Prometheus metrics (EXTENSIONS §13), in a registry of its own.

As on a server, counters and histograms come from the log: ``RouterMetrics.record`` listens to
every ``RouterLog`` line (``request_finished`` carries the node, status, finish reason, queue
wait and duration; the node's kind is the router's record of it), and gauges (each node's
state, busy slots and workers, the same per kind; the queue) are read from the router's
registry at the scrape. The nodes' own series come up their supervisor streams and are
exposed by ``kcoral_server.metrics.node_relay``. Labels: ``kcoral_server.metrics.labels``.
The series labelled by node are counted and written by ``kcoral_server.metrics.node_lines``
(prometheus-client writing them at each scrape held the loop ~125 ms with 256 nodes).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kcoral_server.metrics.exposition import OneMetric, exposition_of
from kcoral_server.metrics.labels import (
    MAX_NAMED_KINDS,
    MAX_NAMED_NODES,
    NODE_STATES,
    ROUTER_FINISH_REASONS,
    TUNNEL_ERRORS,
    BoundedLabels,
    endpoint_of,
    one_of,
    status_label,
)
from kcoral_server.metrics.node_lines import (
    FamilyLines,
    NodeCounter,
    NodeHistogram,
    Row,
)
from kcoral_server.metrics.node_relay import (
    REFUSAL_REASONS,
    LiveNode,
    NodeRelay,
    RelayRefused,
    parse_and_write,
)
from kcoral_server.metrics.server_metrics import SECONDS_BUCKETS
from kcoral_server.router.admission.selection import ready_nodes, waiters_by_selector

if TYPE_CHECKING:
    from kcoral_server.proto import kcoral_gateway_pb2 as pb
    from kcoral_server.router.http_app import RouterState


#: how requests that waited for a node and got none end (a queue_timeout always waited, even
#: 0 s; the others with a wait of 0.0 never queued)
WAITED_IN_VAIN = frozenset({"queue_timeout", "client_disconnected", "shutting_down"})


class RouterGauges(Collector):
    """Per-node, per-kind and queue gauges read from the router's state at each scrape, and
    the connected nodes' own series (``NodeRelay``)."""

    def __init__(
        self,
        read: Callable[[], RouterState | None],
        nodes: BoundedLabels,
        kinds: BoundedLabels,
        relay: NodeRelay,
    ) -> None:
        self._read = read
        self._nodes = nodes
        self._kinds = kinds
        self._relay = relay
        self._node_state = FamilyLines(
            "kcoral_router_node_state",
            "1 for each node's current state",
            "gauge",
            ["node", "state"],
        )
        self._busy = FamilyLines(
            "kcoral_router_node_busy",
            "each node's busy workers (jobs included) or requests on its slots, the more",
            "gauge",
            ["node"],
        )
        self._workers = FamilyLines(
            "kcoral_router_node_workers", "workers each connected node reports", "gauge", ["node"]
        )
        self._info = FamilyLines(
            "kcoral_router_node_info", "1 for each node, with its kind", "gauge", ["node", "kind"]
        )
        #: the nodes whose own series the last ``collect`` found shown (``RouterMetrics``
        #: writes them after the registry's text, from the lines the relay keeps)
        self.live: list[LiveNode] = []

    def collect(self) -> Iterator[Metric]:
        for part in self._read_families():
            yield part if isinstance(part, Metric) else part[0].metric(part[1])

    def text(self) -> bytes:
        """What prometheus-client writes for ``collect``'s families: the per-node ones from
        their kept line heads (``FamilyLines``)."""
        return b"".join(
            generate_latest(OneMetric(part)) if isinstance(part, Metric) else part[0].text(part[1])
            for part in self._read_families()
        )

    def _read_families(self) -> list[Metric | tuple[FamilyLines, list[Row]]]:
        state = self._read()
        if state is None:
            return []
        registry = state.registry
        families: list[Metric | tuple[FamilyLines, list[Row]]] = [
            GaugeMetricFamily(name, documentation, value=float(value))
            for name, documentation, value in (
                (
                    "kcoral_router_queue_depth",
                    "requests waiting for a node",
                    state.admission.waiting,
                ),
                ("kcoral_router_requests_in_progress", "requests on a node", state.in_progress),
                (
                    "kcoral_router_request_capacity",
                    "worker slots, busy and idle, of ready nodes of the default kind (as /health)",
                    registry.capacity(),
                ),
            )
        ]
        # Summed per label value: the nodes past the named ones share ``other``, and a
        # sample repeated in one exposition is an error to Prometheus.
        states: Tally[tuple[str, str]] = Tally()
        node_busy: Tally[str] = Tally()
        node_workers: Tally[str] = Tally()
        kinds: set[tuple[str, str]] = set()
        kind_states: Tally[tuple[str, str]] = Tally()
        kind_busy: Tally[str] = Tally()
        kind_workers: Tally[str] = Tally()
        live: list[LiveNode] = []
        for node in list(registry.nodes.values()):
            label, kind = self._nodes(node.node_id), self._kinds(node.kind)
            node_state_label = one_of(node.state, NODE_STATES)
            states[(label, node_state_label)] += 1
            # A job frees its slot with its 202 and runs on its seat until it ends: counted
            # by slots alone, a node running a job on every seat read as idle. The workers
            # its supervisor reports busy count them (ROUTER §6's load, fleet_status too).
            running = max(node.inflight(), node.busy_workers if node.connected else 0)
            node_busy[label] += running
            # a node that left keeps its record (and last report) until it is forgotten, but
            # offers no worker: counting its last report showed a fleet with a node down as whole
            offered = node.worker_count if node.connected else 0
            node_workers[label] += offered
            kinds.add((label, kind))
            kind_states[(kind, node_state_label)] += 1
            kind_busy[kind] += running
            kind_workers[kind] += offered
            if node.connected and label == node.node_id:
                live.append(LiveNode(node.node_id, node.server_instance_id, label, kind))
        families += [
            (self._node_state, [(key, (float(count),)) for key, count in states.items()]),
            (self._busy, [((label,), (float(node_busy[label]),)) for label in node_workers]),
            (self._workers, [((label,), (float(count),)) for label, count in node_workers.items()]),
            (self._info, [(key, (1.0,)) for key in sorted(kinds)]),
        ]
        by_kind = GaugeMetricFamily(
            "kcoral_router_kind_nodes", "nodes of each kind in each state", labels=["kind", "state"]
        )
        for (kind, node_state_label), count in sorted(kind_states.items()):
            by_kind.add_metric([kind, node_state_label], float(count))
        kind_busy_family = GaugeMetricFamily(
            "kcoral_router_kind_busy", "kcoral_router_node_busy summed per kind", labels=["kind"]
        )
        kind_workers_family = GaugeMetricFamily(
            "kcoral_router_kind_workers",
            "workers the connected nodes of each kind report",
            labels=["kind"],
        )
        for kind in sorted(kind_workers):
            kind_busy_family.add_metric([kind], float(kind_busy[kind]))
            kind_workers_family.add_metric([kind], float(kind_workers[kind]))
        families += [by_kind, kind_busy_family, kind_workers_family]
        families.append(self._kind_queue(state, set(kind_workers)))
        self.live = live
        return families

    def _kind_queue(self, state: RouterState, kinds: set[str]) -> Metric:
        """Requests waiting at the router that a ready node of each kind could serve (one
        that waits for ``zone=a`` counts for every kind with a node in zone a)."""
        registry = state.registry
        ready = ready_nodes(registry)
        kind_of = {n.node_id: self._kinds(n.kind) for n in ready}
        waiters = waiters_by_selector(ready, state.admission.queued_needs(), registry.default_kind)
        depth: Tally[str] = Tally({kind: 0 for kind in kinds})
        for served, count in waiters:
            for kind in {kind_of[node_id] for node_id in served}:
                depth[kind] += count
        family = GaugeMetricFamily(
            "kcoral_router_kind_queue_depth",
            "requests waiting at the router that a ready node of each kind could serve",
            labels=["kind"],
        )
        for kind in sorted(depth):
            family.add_metric([kind], float(depth[kind]))
        return family


class RouterMetrics:
    """One router's metrics. ``record`` is the ``RouterLog`` listener; ``node_status`` gets
    every supervisor status (for the node's own series it may carry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._state: RouterState | None = None
        self._nodes = BoundedLabels(MAX_NAMED_NODES)
        self._kinds = BoundedLabels(MAX_NAMED_KINDS)
        self.relay = NodeRelay()
        registry = self.registry
        self.requests = Counter(
            "kcoral_router_requests",
            "requests the router finished, by HTTP status and finish reason",
            ["status", "reason"],
            registry=registry,
        )
        self.routed = NodeCounter(
            "kcoral_router_routed_requests", "requests the router sent to a node", "node"
        )
        self.tunnel_errors = NodeCounter(
            "kcoral_router_tunnel_errors", "requests whose tunnel to a node failed", "node"
        )
        registry.register(self.routed)
        registry.register(self.tunnel_errors)
        self.duration = Histogram(
            "kcoral_router_request_duration_seconds",
            "request duration at the router, by endpoint",
            ["endpoint"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "kcoral_router_queue_wait_seconds",
            "time a request waited for a node: routed ones, and those that waited in vain",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.node_queue_wait = NodeHistogram(
            "kcoral_router_node_queue_wait_seconds",
            "time a routed request waited for a node, by the node it got",
            "node",
            SECONDS_BUCKETS,
        )
        registry.register(self.node_queue_wait)
        self.kind_routed = Counter(
            "kcoral_router_kind_routed_requests",
            "requests the router sent to a node of each kind",
            ["kind"],
            registry=registry,
        )
        self.kind_tunnel_errors = Counter(
            "kcoral_router_kind_tunnel_errors",
            "requests whose tunnel to a node of each kind failed",
            ["kind"],
            registry=registry,
        )
        self.kind_queue_wait = Histogram(
            "kcoral_router_kind_queue_wait_seconds",
            "time a routed request waited for a node, by the kind of the node it got",
            ["kind"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.relay_refused = Counter(
            "kcoral_router_node_metrics_refused",
            "metrics texts of nodes the router refused, by reason",
            ["node", "reason"],
            registry=registry,
        )
        self._gauges = RouterGauges(lambda: self._state, self._nodes, self._kinds, self.relay)
        registry.register(self._gauges)
        #: the families in the registry's order, each written as one collector
        self._families: list[Collector] = [
            self.requests,
            self.routed,
            self.tunnel_errors,
            self.duration,
            self.queue_wait,
            self.node_queue_wait,
            self.kind_routed,
            self.kind_tunnel_errors,
            self.kind_queue_wait,
            self.relay_refused,
            self._gauges,
        ]

    def attach(self, state: RouterState) -> None:
        self._state = state
        state.log.add_listener(self.record)

    def exposition(self) -> bytes:
        """The router's own metrics, then the connected nodes' (``node_relay``). Written on
        the event loop, so fast: the per-node series (28 lines a node) from the lines'
        heads kept per node (``node_lines``), the rest by prometheus-client."""
        self._prepare()
        own = b"".join(  # finds the nodes shown (``RouterGauges.live``)
            family.text()
            if isinstance(family, (NodeCounter, NodeHistogram, RouterGauges))
            else exposition_of(family)
            for family in self._families
        )
        return own + self.relay.text(self._gauges.live)

    def whole_exposition(self) -> bytes:
        """``exposition``'s text with every sample collected and written by prometheus-client
        at the scrape, as before ``node_lines`` (the same text; the benchmark's baseline)."""
        self._prepare()
        return exposition_of(self.registry) + self.relay.text(self._gauges.live)

    def _prepare(self) -> None:
        self._forget_gone_nodes()
        self._forget_gone_kinds()
        self._count_from_zero()
        self._gauges.live = []

    def _forget_gone_nodes(self) -> None:
        """Free the names of the nodes the router forgot (their records' retention ended)
        and drop their series. Named for the router's whole life, the first 256 node ids
        took every name: on a fleet whose node ids change (a Slurm job's id is in its node's)
        every later node was ``other``, its own series not relayed at all, and each gone
        node's counters stayed in every scrape."""
        if self._state is None:
            return
        known = self._state.registry.nodes
        for node_id in self._nodes.named - set(known):
            self._nodes.release(node_id)
            self.relay.forget(node_id)
            for family in (self.routed, self.tunnel_errors, self.node_queue_wait):
                family.remove(node_id)
            for reason in REFUSAL_REASONS:
                self.relay_refused.remove(node_id, reason)

    def _forget_gone_kinds(self) -> None:
        """Free the names of the kinds no node the router knows has, and drop their series.
        Named for the router's whole life, the first 64 kinds took every name: a node holding
        the node token that reported a new kind in each status made every later kind, a
        fleet's new GPU kind among them, ``other`` in every per-kind series."""
        if self._state is None:
            return
        known = {node.kind for node in self._state.registry.nodes.values()}
        for kind in self._kinds.named - known:
            self._kinds.release(kind)
            for family in (self.kind_routed, self.kind_tunnel_errors, self.kind_queue_wait):
                family.remove(kind)

    def _count_from_zero(self) -> None:
        """Write each known node's and kind's counters at 0 until they count: a series that
        first appears at 1 has no increase to Prometheus (``rate`` and ``increase`` need an
        earlier sample), so a node's first routed request or tunnel error, the one that
        matters on a quiet node, never showed in a rate or a dashboard. Not the refused
        texts' four reasons: a refused node is refused again at each text, so its count
        grows from the second, and four lines a node made each scrape of 256 nodes ~15%
        slower on the router's event loop."""
        if self._state is None:
            return
        kinds: dict[str, None] = {}  # each once, in the order first seen (the lines' order)
        for node in list(self._state.registry.nodes.values()):
            label = self._nodes(node.node_id)
            kinds[self._kinds(node.kind)] = None
            for node_family in (self.routed, self.tunnel_errors, self.node_queue_wait):
                node_family.labels(label)
        for kind in kinds:
            for family in (self.kind_routed, self.kind_tunnel_errors, self.kind_queue_wait):
                family.labels(kind)

    def _kind_of(self, node_id: str) -> str:
        node = self._state.registry.nodes.get(node_id) if self._state is not None else None
        return self._kinds(node.kind if node is not None else None)

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
        wait = fields.get("queue_wait_ms")
        seconds = max(0.0, wait / 1000.0) if isinstance(wait, (int, float)) else None
        if node is None:
            # Never reached a node. One that waited the whole queue wait in vain, or whose
            # client (or the router) gave up while it waited, waited too: left out, the
            # quantiles missed exactly the longest waits of an overload.
            waited = reason == "queue_timeout" or (reason in WAITED_IN_VAIN and seconds)
            if waited and seconds is not None:
                self.queue_wait.observe(seconds)
            return
        label, kind = self._nodes(node), self._kind_of(node)
        self.routed.inc(label)
        self.kind_routed.labels(kind).inc()
        if reason in TUNNEL_ERRORS:
            self.tunnel_errors.inc(label)
            self.kind_tunnel_errors.labels(kind).inc()
        if seconds is not None:
            self.queue_wait.observe(seconds)
            self.node_queue_wait.observe(label, seconds)
            self.kind_queue_wait.labels(kind).observe(seconds)

    async def node_status(self, node_id: str, status: pb.SupervisorStatus) -> None:
        """Keep the node's own series when ``status`` carries them (``node_relay``). The
        text is parsed off the event loop; a refused one is counted and drops the node's
        series, and never ends its stream."""
        blob = status.node_metrics
        if not blob or self._state is None or self._nodes(node_id) != node_id:
            return  # nothing sent, or a node the metrics do not name (so node_id is a label)
        now = time.monotonic()
        if not status.server_healthy or not self.relay.wants(node_id, now):
            return
        try:
            families, lines = await asyncio.get_running_loop().run_in_executor(
                None, parse_and_write, blob, node_id, self._kind_of(node_id)
            )
            nodes = self._state.registry.nodes
            live = [n for n, record in nodes.items() if record.connected]
            self.relay.keep(node_id, status.server_instance_id, families, now, live, lines)
        except RelayRefused as refused:
            self.relay.refuse(node_id)
            self.relay_refused.labels(node_id, refused.reason).inc()
        except Exception as exc:  # a fault here must not end the node's stream
            self.relay.refuse(node_id)
            self._state.log.event(
                "node_metrics_failed", "ERROR", node=node_id, error=f"{type(exc).__name__}: {exc}"
            )
