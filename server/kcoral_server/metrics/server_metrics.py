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

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kcoral_server.metrics.exposition import exposition_of
from kcoral_server.metrics.labels import (
    ERROR_KINDS,
    FINISH_REASONS,
    NONE,
    RETIRE_REASONS,
    START_PHASES,
    gpu_label,
    one_of,
    status_label,
)

if TYPE_CHECKING:
    from kcoral_server.front_door.app import ServerState

#: request and lease times: 1 ms to 1 h (a program may run 15 min by --max-timeout-seconds'
#: default: ending at 10 min, its p95 read 600 s however long it ran)
SECONDS_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    *(900, 1800, 3600),
)
#: the endpoints a request duration is labelled with (``endpoint_of`` maps handlers onto them)
ENDPOINTS = frozenset({"execute", "jobs", "sessions", "health", "info", "worker_status", "metrics"})


@dataclass(frozen=True)
class Family:
    """One metric a server exports: its type, name, help and label names. Declared once
    here: the server makes its metrics from these, and a router passes on a node's series
    only when they match one (``kcoral_server.metrics.node_relay``)."""

    type: str  # "counter", "histogram" or "gauge", as the Prometheus parser names them
    name: str  # without a counter's ``_total``
    documentation: str
    labels: tuple[str, ...] = ()

    def sample_names(self) -> frozenset[str]:
        """The names of this family's samples in the text format (``_created`` left out)."""
        if self.type == "counter":
            return frozenset({self.name + "_total"})
        if self.type == "histogram":
            return frozenset({self.name + suffix for suffix in ("_bucket", "_count", "_sum")})
        return frozenset({self.name})


REQUESTS = Family(
    "counter",
    "kcoral_requests",
    "program requests finished, by HTTP status, finish reason and error kind",
    ("status", "reason", "error_kind"),
)
REQUEST_SECONDS = Family(
    "histogram",
    "kcoral_request_duration_seconds",
    "HTTP request duration, received to answered, by endpoint",
    ("endpoint",),
)
QUEUE_SECONDS = Family(
    "histogram", "kcoral_queue_wait_seconds", "time a request waited for a worker", ("gpu",)
)
LEASE_WAIT = Family(
    "histogram",
    "kcoral_lease_wait_seconds",
    "time a program waited for its GPU lease, per GPU",
    ("gpu",),
)
LEASE_HELD = Family(
    "histogram",
    "kcoral_lease_held_seconds",
    "time a program held its GPU lease, per GPU",
    ("gpu",),
)
WORKER_STARTS = Family("counter", "kcoral_worker_starts", "worker processes that started", ("gpu",))
WORKER_START_FAILURES = Family(
    "counter",
    "kcoral_worker_start_failures",
    "worker processes that failed to start, by phase",
    ("gpu", "phase"),
)
WORKER_RETIREMENTS = Family(
    "counter", "kcoral_worker_retirements", "worker processes retired, by reason", ("gpu", "reason")
)
CACHE_HITS = Family("counter", "kcoral_cache_hits", "referenced blobs found in a cache")
CACHE_HIT_BYTES = Family("counter", "kcoral_cache_hit_bytes", "bytes of the blobs found in a cache")
CACHE_MISSES = Family("counter", "kcoral_cache_misses", "blobs a CACHE_MISS answer named")
#: read from the lease arbiter at each scrape, per GPU: the busy time grows while a program
#: holds the lease (the lease-held histogram learns of a program only when it ends, so a
#: dashboard's GPU use read from it stayed 0 for a whole long program, then jumped)
GPU_BUSY_SECONDS = Family(
    "counter",
    "kcoral_gpu_busy_seconds",
    "seconds the GPU's lease was held (programs, workers' CUDA start), the current hold included",
    ("gpu",),
)
GPU_BUSY = Family("gauge", "kcoral_gpu_busy", "1 while the GPU's lease is held", ("gpu",))
#: gauges read from the server's state at each scrape (``StateGauges``)
QUEUE_DEPTH = Family("gauge", "kcoral_queue_depth", "requests waiting for a worker")
IN_PROGRESS = Family("gauge", "kcoral_requests_in_progress", "requests holding a worker")
#: busy workers included: its help said "workers that can take a request", which beside a
#: busy server's requests in progress read as free workers (as the router's did, a7ed97f)
CAPACITY = Family(
    "gauge",
    "kcoral_request_capacity",
    "workers serving requests, busy and idle (as /health's request_capacity)",
)
SEATS_HELD = Family("gauge", "kcoral_session_seats_held", "seats held by live sessions")
MEMORY_CACHE_BYTES = Family("gauge", "kcoral_memory_cache_bytes", "bytes in the memory cache")
MEMORY_CACHE_ENTRIES = Family("gauge", "kcoral_memory_cache_entries", "blobs in the memory cache")

#: every family a server exports
SERVER_FAMILIES = (
    REQUESTS,
    REQUEST_SECONDS,
    QUEUE_SECONDS,
    LEASE_WAIT,
    LEASE_HELD,
    WORKER_STARTS,
    WORKER_START_FAILURES,
    WORKER_RETIREMENTS,
    CACHE_HITS,
    CACHE_HIT_BYTES,
    CACHE_MISSES,
    QUEUE_DEPTH,
    IN_PROGRESS,
    CAPACITY,
    SEATS_HELD,
    MEMORY_CACHE_BYTES,
    MEMORY_CACHE_ENTRIES,
    GPU_BUSY_SECONDS,
    GPU_BUSY,
)


def counter(family: Family, registry: CollectorRegistry) -> Counter:
    return Counter(family.name, family.documentation, family.labels, registry=registry)


def histogram(family: Family, registry: CollectorRegistry) -> Histogram:
    return Histogram(
        family.name,
        family.documentation,
        family.labels,
        buckets=SECONDS_BUCKETS,
        registry=registry,
    )


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
            (QUEUE_DEPTH, pool.requests_waiting),
            (IN_PROGRESS, pool.requests_in_progress),
            (CAPACITY, 0 if state.shutting_down else pool.request_capacity),
            (SEATS_HELD, state.sessions.active),
            (MEMORY_CACHE_BYTES, state.memory_cache.used_bytes),
            (MEMORY_CACHE_ENTRIES, len(state.memory_cache)),
        ]
        for family, value in values:
            yield GaugeMetricFamily(family.name, family.documentation, value=float(value))
        arbiter = state.arbiter
        if arbiter is None:
            return  # a CPU server holds no lease
        busy_seconds = CounterMetricFamily(
            GPU_BUSY_SECONDS.name, GPU_BUSY_SECONDS.documentation, labels=GPU_BUSY_SECONDS.labels
        )
        busy = GaugeMetricFamily(GPU_BUSY.name, GPU_BUSY.documentation, labels=GPU_BUSY.labels)
        now = time.monotonic()
        for gpu in arbiter.gpu_ids:
            busy_seconds.add_metric([str(gpu)], arbiter.held_seconds(gpu, now))
            busy.add_metric([str(gpu)], 0.0 if arbiter.holder(gpu) is None else 1.0)
        yield from (busy_seconds, busy)


class ServerMetrics:
    """One server's metrics. ``record`` is the event log listener; ``exposition`` the text a
    scrape gets."""

    def __init__(self, gpu_ids: list[int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._gpus = frozenset(gpu_ids)
        self._state: ServerState | None = None
        registry = self.registry
        self.requests = counter(REQUESTS, registry)
        self.request_seconds = histogram(REQUEST_SECONDS, registry)
        self.queue_seconds = histogram(QUEUE_SECONDS, registry)
        self.lease_wait = histogram(LEASE_WAIT, registry)
        self.lease_held = histogram(LEASE_HELD, registry)
        self.worker_starts = counter(WORKER_STARTS, registry)
        self.worker_start_failures = counter(WORKER_START_FAILURES, registry)
        self.worker_retirements = counter(WORKER_RETIREMENTS, registry)
        self.cache_hits = counter(CACHE_HITS, registry)
        self.cache_hit_bytes = counter(CACHE_HIT_BYTES, registry)
        self.cache_misses = counter(CACHE_MISSES, registry)
        registry.register(StateGauges(lambda: self._state))
        self._count_workers_from_zero()

    def _count_workers_from_zero(self) -> None:
        """Write every label set of the workers' counters at 0 from the start: a series that
        first appears at 1 has no increase to Prometheus (``rate`` and ``increase`` need an
        earlier sample), so each GPU's first crash retirement or failed start never showed
        in a rate or a dashboard. Their sets are small: GPUs x reasons."""
        for gpu in [str(gpu_id) for gpu_id in sorted(self._gpus)] or ["cpu"]:
            self.worker_starts.labels(gpu)
            for phase in sorted(START_PHASES):
                self.worker_start_failures.labels(gpu, phase)
            for reason in sorted(RETIRE_REASONS):
                self.worker_retirements.labels(gpu, reason)

    def attach(self, state: ServerState) -> None:
        """Read gauges from ``state`` and count its event log's records."""
        self._state = state
        state.events.add_listener(self.record)

    def exposition(self) -> bytes:
        return exposition_of(self.registry)

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
        seat_gpu = self._gpu(fields)
        gpus = [seat_gpu]
        if isinstance(gpu_ids, list):
            # a GPU-set request's set; none: it waited for one in vain, for no GPU in
            # particular (not its borrowed seat's)
            gpus = [gpu_label(g, self._gpus) for g in gpu_ids] or [NONE]
        queue_ms = fields.get("queue_ms")
        waited_ms = fields.get("waited_ms")
        if isinstance(queue_ms, (int, float)) and "worker_id" in fields:
            # the wait for a seat, on the seat's GPU (a set request's set came after it)
            self.queue_seconds.labels(seat_gpu).observe(max(0.0, queue_ms / 1000.0))
        elif isinstance(waited_ms, (int, float)):  # waited in vain: no seat, so no GPU
            self.queue_seconds.labels(NONE).observe(max(0.0, waited_ms / 1000.0))
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
