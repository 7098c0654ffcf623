"""A server's Prometheus metrics (EXTENSIONS §13), in a registry of its own (several
applications share one process in tests, and a process-wide registry would mix them).

Counters and histograms are fed by the event log: ``ServerMetrics.record`` listens to every
record (``EventLog.add_listener``), because every interesting point already emits one with the
facts a metric needs (``request_finished`` has the status, error kind and lease times,
``worker_ready``/``worker_retired`` the workers' lives, ``request_accepted`` the cache hits), so
no call site learns about metrics and the log and the metrics cannot disagree. Gauges (queue
depth, seats, cache bytes) are read from the server's state when scraped. Request duration is
the one measurement no event holds; the application reports it per endpoint as Tornado
finishes each request (``observe_request``).

Labels come only from the fixed sets of ``kcoral_server.metrics.labels``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kcoral_server.metrics.labels import (
    ERROR_KINDS,
    FINISH_REASONS,
    RETIRE_REASONS,
    START_PHASES,
    gpu_label,
    one_of,
    status_label,
)

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState

#: request and lease times: 1 ms to 10 min
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
#: the endpoints a request duration is labelled with (``endpoint_of`` maps handlers onto them)
ENDPOINTS = frozenset({"execute", "jobs", "sessions", "health", "info", "worker_status", "metrics"})


class StateGauges(Collector):
    """Gauges read from the server's state at each scrape."""

    def __init__(self, read: Callable[[], ServerState | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        state = self._read()
        if state is None:
            return
        pool = state.pool
        values = [
            ("kcoral_queue_depth", "requests waiting for a worker", pool.requests_waiting),
            ("kcoral_requests_in_progress", "requests holding a worker", pool.requests_in_progress),
            (
                "kcoral_request_capacity",
                "workers that can take a request",
                0 if state.shutting_down else pool.request_capacity,
            ),
            ("kcoral_session_seats_held", "seats held by live sessions", state.sessions.active),
            (
                "kcoral_memory_cache_bytes",
                "bytes in the memory cache",
                state.memory_cache.used_bytes,
            ),
            ("kcoral_memory_cache_entries", "blobs in the memory cache", len(state.memory_cache)),
        ]
        for name, documentation, value in values:
            yield GaugeMetricFamily(name, documentation, value=float(value))


class ServerMetrics:
    """One server's metrics. ``record`` is the event log listener; ``exposition`` the text a
    scrape gets."""

    def __init__(self, gpu_ids: list[int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._gpus = frozenset(gpu_ids)
        self._state: ServerState | None = None
        registry = self.registry
        self.requests = Counter(
            "kcoral_requests",
            "program requests finished, by HTTP status, finish reason and error kind",
            ["status", "reason", "error_kind"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "kcoral_request_duration_seconds",
            "HTTP request duration, received to answered, by endpoint",
            ["endpoint"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.queue_seconds = Histogram(
            "kcoral_queue_wait_seconds",
            "time a request waited for a worker",
            ["gpu"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.lease_wait = Histogram(
            "kcoral_lease_wait_seconds",
            "time a program waited for its GPU lease, per GPU",
            ["gpu"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.lease_held = Histogram(
            "kcoral_lease_held_seconds",
            "time a program held its GPU lease, per GPU",
            ["gpu"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.worker_starts = Counter(
            "kcoral_worker_starts", "worker processes that started", ["gpu"], registry=registry
        )
        self.worker_start_failures = Counter(
            "kcoral_worker_start_failures",
            "worker processes that failed to start, by phase",
            ["gpu", "phase"],
            registry=registry,
        )
        self.worker_retirements = Counter(
            "kcoral_worker_retirements",
            "worker processes retired, by reason",
            ["gpu", "reason"],
            registry=registry,
        )
        self.cache_hits = Counter(
            "kcoral_cache_hits", "referenced blobs found in a cache", registry=registry
        )
        self.cache_hit_bytes = Counter(
            "kcoral_cache_hit_bytes", "bytes of the blobs found in a cache", registry=registry
        )
        self.cache_misses = Counter(
            "kcoral_cache_misses", "blobs a CACHE_MISS answer named", registry=registry
        )
        registry.register(StateGauges(lambda: self._state))

    def attach(self, state: ServerState) -> None:
        """Read gauges from ``state`` and count its event log's records."""
        self._state = state
        state.events.add_listener(self.record)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def observe_request(self, endpoint: str | None, seconds: float) -> None:
        if endpoint in ENDPOINTS:
            self.request_seconds.labels(endpoint).observe(max(0.0, seconds))

    # ------------------------------------------------------------------ the listener

    def record(self, event: str, fields: dict[str, Any]) -> None:
        handler = self._HANDLERS.get(event)
        if handler is not None:
            handler(self, fields)

    def _gpu(self, fields: dict[str, Any]) -> str:
        return gpu_label(fields.get("gpu_id"), self._gpus)

    def _finished(self, fields: dict[str, Any]) -> None:
        self.requests.labels(
            status_label(fields.get("http_status")),
            one_of(fields.get("finish_reason"), FINISH_REASONS),
            one_of(fields.get("error_kind"), ERROR_KINDS),
        ).inc()
        missing = fields.get("missing")
        if isinstance(missing, int) and missing > 0:
            self.cache_misses.inc(missing)
        gpu_ids = fields.get("gpu_ids")
        gpus = (
            [gpu_label(g, self._gpus) for g in gpu_ids]
            if isinstance(gpu_ids, list) and gpu_ids
            else [self._gpu(fields)]
        )
        queue_ms = fields.get("queue_ms")
        if isinstance(queue_ms, (int, float)) and "worker_id" in fields:
            self.queue_seconds.labels(gpus[0]).observe(max(0.0, queue_ms / 1000.0))
        wait_ms, held_ms = fields.get("lease_wait_ms"), fields.get("lease_held_ms")
        for gpu in gpus:
            if gpu == "cpu":
                continue  # a CPU seat holds no lease
            if isinstance(wait_ms, (int, float)):
                self.lease_wait.labels(gpu).observe(max(0.0, wait_ms / 1000.0))
            if isinstance(held_ms, (int, float)):
                self.lease_held.labels(gpu).observe(max(0.0, held_ms / 1000.0))

    def _accepted(self, fields: dict[str, Any]) -> None:
        hits, hit_bytes = fields.get("cache_hits"), fields.get("cache_hit_bytes")
        if isinstance(hits, int) and hits > 0:
            self.cache_hits.inc(hits)
        if isinstance(hit_bytes, int) and hit_bytes > 0:
            self.cache_hit_bytes.inc(hit_bytes)

    def _ready(self, fields: dict[str, Any]) -> None:
        self.worker_starts.labels(self._gpu(fields)).inc()

    def _failed(self, fields: dict[str, Any]) -> None:
        phase = one_of(fields.get("phase"), START_PHASES)
        self.worker_start_failures.labels(self._gpu(fields), phase).inc()

    def _retired(self, fields: dict[str, Any]) -> None:
        reason = one_of(fields.get("reason"), RETIRE_REASONS)
        self.worker_retirements.labels(self._gpu(fields), reason).inc()

    _HANDLERS: ClassVar[dict[str, Callable[[ServerMetrics, dict[str, Any]], None]]] = {
        "request_finished": _finished,
        "request_accepted": _accepted,
        "worker_ready": _ready,
        "worker_failed": _failed,
        "worker_retired": _retired,
    }
