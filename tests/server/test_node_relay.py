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
    first, second = LiveNode("n1", "i1", "n1", "cpu"), LiveNode("n2", "i2", "n2", "h100")
    for node, text in ((first, ODD), (second, BUCKETS)):
        families, lines = node_relay.parse_and_write(text, node.node_label, node.kind_label)
        relay.keep(node.node_id, node.server_instance_id, families, 0.0, ["n1", "n2"], lines)

    class Reference:
        def collect(self):
            return relay.collect([first, second])

    assert relay.text([first, second]) == generate_latest(Reference())
    assert b'error_kind="a\\"b\\\\c"' in relay.text([first, second])


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
