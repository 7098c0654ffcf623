"""A router's per-node series written from kept line heads (``kcoral_server.metrics.node_lines``)
are the text prometheus-client writes for the same counts: the per-node counters and
histogram against the library's own ``Counter`` and ``Histogram`` fed the same, and a whole
router scrape of more nodes than it names against every sample written by the library."""

from __future__ import annotations

import io
import math
import random
import subprocess
import sys

from kcoral_server.metrics.exposition import OneMetric, exposition_of
from kcoral_server.metrics.labels import MAX_NAMED_NODES
from kcoral_server.metrics.node_lines import (
    FamilyLines,
    NodeCounter,
    NodeHistogram,
    go_float_text,
)
from kcoral_server.metrics.server_metrics import SECONDS_BUCKETS
from kcoral_server.router.log import RouterLog
from kcoral_server.router.main import build_state
from kcoral_server.router.nodes.registry import READY, NodeRecord
from kcoral_server.router.settings import parse_router_args
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

#: node ids a label must escape or that hold a space (a value is what follows the last one)
ODD_NODE_IDS = ('quote"node', "back\\slash", "new\nline", "two words", "ünïcode")
#: waits on a bucket bound, between bounds, past the last, and odd floats
WAITS = (0.0, 0.001, 0.0010001, 0.1, 0.25, 599.99, 600.0, 3600.0, 1e9, math.inf, 1e-300, 7.3)
#: gauge values: both zeros (twice: each distinct value is formatted once), NaN, infinities
ODD_VALUES = (0.0, -0.0, math.nan, math.inf, -math.inf, 1e21, 1234567.0, 1.5, 0.0, -0.0)


def test_a_node_histogram_writes_what_prometheus_clients_histogram_writes_for_the_same_waits() -> (
    None
):
    ours = NodeHistogram("kcoral_router_node_queue_wait_seconds", "waits", "node", SECONDS_BUCKETS)
    registry = CollectorRegistry()
    theirs = Histogram(
        "kcoral_router_node_queue_wait_seconds",
        "waits",
        ["node"],
        buckets=SECONDS_BUCKETS,
        registry=registry,
    )
    rng = random.Random(3)
    nodes = [*ODD_NODE_IDS, "a", "b", "c"]
    for round_ in range(4):
        for node in nodes:
            ours.labels(node)
            theirs.labels(node)
        for _ in range(300):
            node, wait = rng.choice(nodes), rng.choice((*WAITS, rng.expovariate(1 / 30)))
            ours.observe(node, wait)
            theirs.labels(node).observe(wait)
        assert ours.text() == exposition_of(registry), round_
        gone = nodes.pop(rng.randrange(len(nodes)))  # its series go, and come back last
        ours.remove(gone)
        theirs.remove(gone)
        assert ours.text() == exposition_of(registry), round_
        nodes.append(gone)


def test_a_node_counter_writes_what_prometheus_clients_counter_writes_for_the_same_counts() -> None:
    ours = NodeCounter("kcoral_router_routed_requests", 'sent "to" a\\node', "node")
    registry = CollectorRegistry()
    theirs = Counter(
        "kcoral_router_routed_requests", 'sent "to" a\\node', ["node"], registry=registry
    )
    assert ours.text() == exposition_of(registry)  # the header alone
    for count, node in enumerate((*ODD_NODE_IDS, "a")):
        ours.labels(node)
        theirs.labels(node)
        for _ in range(count * 40_001):  # past a million, written with an exponent
            ours.inc(node)
        theirs.labels(node).inc(count * 40_001)
    ours.remove("a")
    theirs.remove("a")
    ours.remove("never counted")
    assert ours.text() == exposition_of(registry)


def test_a_gauge_written_from_kept_heads_is_the_librarys_text_for_any_value() -> None:
    """Each distinct value is formatted once a scrape: 0.0 and -0.0 are one dict key but
    two texts, and a NaN is never equal to itself."""
    lines = FamilyLines("kcoral_router_node_busy", "busy", "gauge", ["node", "state"])
    odd = ODD_VALUES
    for shift in range(3):
        rows = [((node, "ready"), (odd[(i + shift) % len(odd)],)) for i, node in enumerate(
            (*ODD_NODE_IDS, "a", "b", "c", "d", "e")
        )]  # fmt: skip
        assert lines.text(rows) == generate_latest(OneMetric(lines.metric(rows))), shift


def test_a_routers_scrape_is_the_text_prometheus_client_writes_for_every_sample() -> None:
    """More nodes than the metrics name (``other`` sums the rest), nodes that change state,
    leave and are forgotten between scrapes: each scrape's text is the library's."""
    state = build_state(parse_router_args(["--port", "0"]), RouterLog(io.StringIO()))
    metrics, nodes = state.metrics, state.registry.nodes
    node_ids = [f"n{i}" for i in range(MAX_NAMED_NODES + 6)] + list(ODD_NODE_IDS)
    for i, node_id in enumerate(node_ids):
        nodes[node_id] = NodeRecord(
            node_id, state=READY, kind=f"k{i % 3}", worker_count=4, busy_workers=i % 5,
            connected=True,
        )  # fmt: skip
    rng = random.Random(5)
    for scrape in range(4):
        for _ in range(2000):
            state.log.event(
                "request_finished",
                path="/execute",
                http_status=rng.choice((200, 502)),
                finish_reason=rng.choice(("ok", "tunnel_disconnected")),
                node=rng.choice(node_ids),
                queue_wait_ms=rng.choice((*WAITS, rng.expovariate(1 / 300))),
                duration_ms=rng.expovariate(1 / 50),
            )
        text = metrics.exposition()
        assert text == metrics.whole_exposition(), scrape
        assert list(text_string_to_metric_families(text.decode()))  # prometheus-client reads it
        gone = node_ids.pop(rng.randrange(len(node_ids)))
        del nodes[gone]  # forgotten: its name and series go
        nodes[node_ids[0]].connected = False
        nodes[node_ids[1]].kind = "a new kind"
    assert 'node="other"' in text.decode()


def test_the_fallback_formatter_writes_what_prometheus_clients_writes_for_every_value() -> None:
    """``go_float_text`` stands in for prometheus-client's ``floatToGoString``, an internal
    a release may drop: the router's metrics would then not import at all. Counts as the
    counters and histograms write them (ints, past a million with an exponent) included."""
    counts = [count * 40_001 for count in range(len(ODD_NODE_IDS) + 1)]
    big = (12345678.0, 100000000.5, 4000100, 10**7, -12345678.0, 1e16, 2**62, 5e-324)
    for value in (*WAITS, *ODD_VALUES, *SECONDS_BUCKETS, *counts, *big):
        assert go_float_text(value) == floatToGoString(value), value


def test_the_routers_metrics_import_and_write_where_prometheus_client_lacks_its_formatter() -> None:
    program = (
        "import prometheus_client.utils as utils\n"
        "del utils.floatToGoString\n"
        "from kcoral_server.metrics import node_lines, node_relay, router_metrics\n"
        "assert node_relay.go_float is node_lines.go_float_text\n"
        "assert node_lines.go_float is node_lines.go_float_text\n"
        "lines = node_lines.FamilyLines('busy', 'busy', 'gauge', ['node'])\n"
        "print(lines.text([(('a',), (12345678.0,))]).decode().splitlines()[-1])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == 'busy{node="a"} 1.2345678e+07\n'
