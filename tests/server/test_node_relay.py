"""The router's checks of a node's metrics text (``kcoral_server.metrics.node_relay``): the
decisions a real router and node exercise in ``tests/router/test_router_node_metrics.py`` and
``tests/security/test_router_attack_node_metrics.py``, here with the clock and bounds in the
test's hands."""

from __future__ import annotations

import pytest
from kcoral_server.metrics import node_relay
from kcoral_server.metrics.node_relay import (
    MIN_RELAY_INTERVAL_SECONDS,
    LiveNode,
    NodeRelay,
    RelayRefused,
    parse_node_metrics,
)
from kcoral_server.metrics.server_metrics import ServerMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

BUCKETS = b"""# TYPE kcoral_lease_wait_seconds histogram
kcoral_lease_wait_seconds_bucket{gpu="0",le="0.5"} 1
kcoral_lease_wait_seconds_bucket{gpu="0",le="NaN"} 1
kcoral_lease_wait_seconds_bucket{gpu="0",le="soon"} 1
kcoral_lease_wait_seconds_bucket{gpu="0"} 1
kcoral_lease_wait_seconds_count{gpu="0"} 1
"""


def samples_of(relay: NodeRelay, *live: LiveNode) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for m in relay.collect(live) for s in m.samples]


def test_a_servers_own_exposition_passes_whole_but_its_created_times() -> None:
    metrics = ServerMetrics([0])
    metrics.record("worker_ready", {"gpu_id": 0})
    metrics.observe_request("execute", 0.2)
    families = parse_node_metrics(metrics.exposition())
    names = {name for _, samples in families for name, _, _ in samples}
    assert "kcoral_worker_starts_total" in names
    assert "kcoral_request_duration_seconds_bucket" in names
    assert not [name for name in names if name.endswith("_created")]


def test_a_bucket_without_a_number_for_its_bound_is_dropped() -> None:
    ((family, samples),) = parse_node_metrics(BUCKETS)
    assert family.name == "kcoral_lease_wait_seconds"
    assert [(name, values) for name, values, _ in samples] == [
        ("kcoral_lease_wait_seconds_bucket", ("0", "0.5")),
        ("kcoral_lease_wait_seconds_count", ("0",)),
    ]


def test_a_family_of_the_wrong_type_is_dropped() -> None:
    text = b"# TYPE kcoral_queue_depth counter\nkcoral_queue_depth_total 5\n"
    assert parse_node_metrics(text) == ()


def test_a_node_is_read_at_most_once_per_interval() -> None:
    relay = NodeRelay()
    assert relay.wants("n1", 100.0)
    assert not relay.wants("n1", 100.0 + MIN_RELAY_INTERVAL_SECONDS / 2)
    assert relay.wants("n2", 100.0)
    assert relay.wants("n1", 100.0 + MIN_RELAY_INTERVAL_SECONDS)


def test_the_router_refuses_a_text_that_would_pass_the_bound_of_all_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    families = parse_node_metrics(BUCKETS)  # two samples
    monkeypatch.setattr(node_relay, "MAX_RELAYED_SAMPLES", 3)
    relay = NodeRelay()
    relay.keep("n1", "i1", families, 0.0, ["n1", "n2"])
    with pytest.raises(RelayRefused) as refused:
        relay.keep("n2", "i2", families, 0.0, ["n1", "n2"])
    assert refused.value.reason == "router_full"
    # A node that left makes room.
    relay.keep("n2", "i2", families, 0.0, ["n2"])
    assert relay.samples == 2


def test_a_nodes_series_show_only_for_the_server_instance_they_came_from() -> None:
    relay = NodeRelay()
    relay.keep("n1", "i1", parse_node_metrics(BUCKETS), 0.0, ["n1"])
    assert samples_of(relay, LiveNode("n1", "i2", "n1", "cpu")) == []
    shown = samples_of(relay, LiveNode("n1", "i1", "n1", "cpu"))
    assert shown[0] == (
        "kcoral_lease_wait_seconds_bucket",
        {"gpu": "0", "le": "0.5", "node": "n1", "kind": "cpu"},
        1.0,
    )


# Two nodes' texts, with a label value that needs escaping in the exposition format.
ODD = (
    b"""# TYPE kcoral_requests_total counter
kcoral_requests_total{status="200",reason="completed",error_kind="a\\"b\\\\c"} 4
"""
    + BUCKETS
)


def test_the_scrape_text_is_what_prometheus_client_writes_for_the_same_series() -> None:
    relay = NodeRelay()
    first, second = LiveNode("n1", "i1", "n1", 'a"b\\c'), LiveNode("n2", "i2", "n2", "h100")
    for node, text in ((first, ODD), (second, BUCKETS)):
        families, lines = node_relay.parse_and_write(text, node.node_label, node.kind_label)
        relay.keep(node.node_id, node.server_instance_id, families, 0.0, ["n1", "n2"], lines)

    class Reference:
        def collect(self):
            return relay.collect([first, second])

    assert relay.text([first, second]) == generate_latest(Reference())
    assert b'kind="a\\"b\\\\c"' in relay.text([first, second])  # escaped as the library does
    assert b'error_kind="other"' in relay.text([first, second])  # not a server's word


def test_a_scrape_writes_no_line_of_a_text_written_when_it_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    relay, node = NodeRelay(), LiveNode("n1", "i1", "n1", "cpu")
    families, lines = node_relay.parse_and_write(ODD, "n1", "cpu")
    relay.keep("n1", "i1", families, 0.0, ["n1"], lines)
    written = relay.text([node])

    def refuse(*args: object) -> None:
        raise AssertionError("a scrape wrote a node's lines again")

    monkeypatch.setattr(node_relay, "write_lines", refuse)
    assert relay.text([node]) == written
    monkeypatch.undo()
    # The node's kind label changed since (a name the router gave): written anew, once.
    renamed = LiveNode("n1", "i1", "n1", "other")
    assert b'kind="other"' in relay.text([renamed])
    monkeypatch.setattr(node_relay, "write_lines", refuse)
    assert b'kind="other"' in relay.text([renamed])


def test_a_bucket_bound_spelled_two_ways_is_one_bound_as_a_server_writes_it() -> None:
    text = b"""# TYPE kcoral_lease_wait_seconds histogram
kcoral_lease_wait_seconds_bucket{gpu="0",le="1e-1"} 1
kcoral_lease_wait_seconds_bucket{gpu="0",le="0.1"} 5
kcoral_lease_wait_seconds_bucket{gpu="0",le="10"} 2
"""
    ((_, samples),) = parse_node_metrics(text)
    assert [(values, value) for _, values, value in samples] == [
        (("0", "0.1"), 1.0),  # the first of the two; the other would split sum by (le)
        (("0", "10.0"), 2.0),
    ]


def made_up_text(word: str) -> bytes:
    """A node token holder's text: every label of a server's series holds a word of its own."""
    return f"""# TYPE kcoral_requests_total counter
kcoral_requests_total{{status="7{word[:2]}",reason="{word}",error_kind="{word}"}} 1
kcoral_requests_total{{status="{word}",reason="completed",error_kind="none"}} 1
# TYPE kcoral_worker_retirements_total counter
kcoral_worker_retirements_total{{gpu="{word}",reason="{word}"}} 1
kcoral_worker_retirements_total{{gpu="0{word[:2]}",reason="crashed"}} 1
# TYPE kcoral_worker_start_failures_total counter
kcoral_worker_start_failures_total{{gpu="9{word[:3]}",phase="{word}"}} 1
# TYPE kcoral_request_duration_seconds histogram
kcoral_request_duration_seconds_bucket{{endpoint="{word}",le="0.{word[:3]}"}} 1
kcoral_request_duration_seconds_bucket{{endpoint="{word}",le="+Inf"}} 1
kcoral_request_duration_seconds_count{{endpoint="{word}"}} 1
""".encode()


def relayed_series(text: bytes) -> set[tuple[str, tuple[str, ...]]]:
    return {
        (name, values) for _, samples in parse_node_metrics(text) for name, values, _ in samples
    }


def test_a_nodes_made_up_label_values_are_relayed_as_other_so_its_series_stay_bounded() -> None:
    """A node's label values were relayed as it wrote them: a node token holder sending new
    words in every text (every 5 s) grew the router's series, and Prometheus's, without end.
    Each is now the server's own word or ``other``; a bucket bound a server never writes
    goes."""
    first, second = relayed_series(made_up_text("123abc")), relayed_series(made_up_text("456def"))
    assert first == second, first ^ second
    assert first == {
        ("kcoral_requests_total", ("other", "other", "other")),
        ("kcoral_requests_total", ("other", "completed", "none")),
        ("kcoral_worker_retirements_total", ("other", "other")),
        ("kcoral_worker_retirements_total", ("other", "crashed")),
        ("kcoral_worker_start_failures_total", ("other", "other")),
        ("kcoral_request_duration_seconds_bucket", ("other", "+Inf")),
        ("kcoral_request_duration_seconds_count", ("other",)),
    }


def test_a_servers_own_label_values_are_relayed_as_it_wrote_them() -> None:
    metrics = ServerMetrics([0, 7])
    for finished in (
        {"http_status": 200, "finish_reason": "completed", "gpu_id": 7, "queue_ms": 1.0},
        {"http_status": 503, "finish_reason": "no_worker", "error_kind": "busy", "waited_ms": 9},
        {"http_status": 499, "finish_reason": "cancelled", "gpu_ids": [], "lease_wait_ms": 3},
        {"http_status": 200, "finish_reason": "made-up", "error_kind": "made-up"},
    ):
        metrics.record("request_finished", finished)
    metrics.record("worker_retired", {"gpu_id": 0, "reason": "crashed"})
    metrics.record("worker_failed", {"gpu_id": 7, "phase": "respawn"})
    metrics.observe_request("worker_status", 0.3)
    text = metrics.exposition()
    written = {
        (sample.name, tuple(v for k, v in sorted(sample.labels.items()) if k != "le"))
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if not sample.name.endswith("_created")
    }
    relayed = {
        (name, tuple(sorted(values[: len(values) - name.endswith("_bucket")])))
        for name, values in relayed_series(text)
    }
    assert {(name, tuple(sorted(values))) for name, values in written} == relayed


def test_a_nodes_status_is_relayed_only_as_one_a_server_answers() -> None:
    """Any three digits of 100-599 were relayed: a rogue node cycling 500 statuses against
    every reason and error kind made some 156,000 series a node id over a few minutes.
    Statuses no server answers are ``other`` now; every one a server does is kept."""
    lines = ["# TYPE kcoral_requests_total counter"]
    lines += [
        f'kcoral_requests_total{{status="{status}",reason="completed",error_kind="none"}} 1'
        for status in range(100, 600)
    ]
    statuses = {values[0] for _, values in relayed_series("\n".join(lines).encode() + b"\n")}
    answered = {"200", "202", "400", "401", "403", "404", "409", "410", "413", "499", "503"}
    assert answered | {"504", "other"} <= statuses
    assert {"418", "451", "599", "100", "123"}.isdisjoint(statuses)
    assert len(statuses) <= 32
