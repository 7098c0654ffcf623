"""Attacks on a router through the metrics text a node sends up its supervisor stream
(issue 33.4, EXTENSIONS §13). The attacker holds the node token and plays a node: a fake
supervisor over real gRPC against a real ``kcoral router`` (``tests/router/router_helpers``).
It tries to speak for another node (a forged ``node``/``kind`` label, the router's own
series), to add series of its own, and to make the router hold or parse too much. The router
relabels, drops and refuses; the attacker's node, and every other, keeps serving."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kcoral_server.metrics.node_relay import MAX_NODE_METRICS_BYTES, MAX_NODE_SAMPLES
from node_metrics_support import MetricsNode, Sample, matching, wait_for_samples
from router_helpers import http_request, start_router, wait_for_health

NODE_TOKEN = "node-token-for-metrics-attacks"

HONEST = b"# TYPE kcoral_queue_depth gauge\nkcoral_queue_depth 3\n"
FORGED = b"""# TYPE kcoral_queue_depth gauge
kcoral_queue_depth{node="gpu-victim",kind="h100"} 99
# TYPE kcoral_router_node_state gauge
kcoral_router_node_state{node="gpu-victim",state="unhealthy"} 1
# TYPE kcoral_router_routed_requests_total counter
kcoral_router_routed_requests_total{node="gpu-victim"} 1000
# TYPE evil_series gauge
evil_series{secret="x"} 1
# TYPE kcoral_requests_total counter
kcoral_requests_total{status="200",reason="completed",error_kind="none",extra="y"} 5
kcoral_requests_total{status="200",reason="completed",error_kind="none"} 7
kcoral_requests_total{status="200",reason="completed",error_kind="none"} 8
kcoral_requests_total{status="%s",reason="completed",error_kind="none"} 9
# TYPE kcoral_worker_starts_total counter
kcoral_worker_starts_total{gpu="a-new-word-every-text"} 4
""" % (b"4" * 200)
#: valid lines, more of them than the router reads
OVERSIZED = b"# TYPE kcoral_worker_starts_total counter\n" + b"".join(
    b'kcoral_worker_starts_total{gpu="%d"} 1\n' % i for i in range(6000)
)
#: small enough, but more samples than the router keeps of one node
TOO_MANY = b"# TYPE kcoral_worker_starts_total counter\n" + b"".join(
    b'kcoral_worker_starts_total{gpu="%d"} 1\n' % i for i in range(MAX_NODE_SAMPLES + 1)
)
GARBAGE = b"\xff\xfe{{{ this is no exposition \x00"


def capacity(n: int):
    return lambda body: body["load"]["request_capacity"] >= n


def only(samples: list[Sample], name: str, **labels: str) -> Sample:
    found = matching(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_a_node_cannot_speak_for_another_or_add_series_through_its_metrics(
    tmp_path: Path,
) -> None:
    assert len(OVERSIZED) > MAX_NODE_METRICS_BYTES > len(TOO_MANY)
    router = start_router(tmp_path, env={"KCORAL_NODE_TOKEN": NODE_TOKEN})

    async def scenario() -> None:
        nodes = [  # the cpu nodes first: cpu is the default kind, which /health counts
            MetricsNode(router.port, "gpu-rogue", token=NODE_TOKEN, text=FORGED),
            MetricsNode(router.port, "gpu-big", token=NODE_TOKEN, text=OVERSIZED),
            MetricsNode(router.port, "gpu-many", token=NODE_TOKEN, text=TOO_MANY),
            MetricsNode(router.port, "gpu-junk", token=NODE_TOKEN, text=GARBAGE),
            MetricsNode(router.port, "gpu-victim", token=NODE_TOKEN, text=HONEST, gpu="h100"),
        ]
        try:
            for node in nodes[:-1]:
                await node.start()
            await wait_for_health(router.port, capacity(len(nodes) - 1))
            await nodes[-1].start()
            samples = await asyncio.to_thread(
                wait_for_samples,
                router.url,
                lambda s: (
                    matching(s, "kcoral_queue_depth", node="gpu-rogue")
                    and matching(s, "kcoral_queue_depth", node="gpu-victim")
                    and matching(s, "kcoral_router_node_state", node="gpu-victim", state="ready")
                    and len(matching(s, "kcoral_router_node_metrics_refused_total")) >= 3
                ),
                "the rogue's series and three refusals",
            )
            # The victim's series are its own; the forged one is the rogue's, under the
            # rogue's id and kind, as the router knows them.
            assert only(samples, "kcoral_queue_depth", node="gpu-victim").value == 3
            assert only(samples, "kcoral_queue_depth", node="gpu-victim").labels["kind"] == "h100"
            forged = only(samples, "kcoral_queue_depth", node="gpu-rogue")
            assert forged.value == 99 and forged.labels["kind"] == "cpu"
            # The router's own series are the router's: one state per node, no routed count
            # for a node that was sent nothing (each node's at 0, as it starts).
            assert only(samples, "kcoral_router_node_state", node="gpu-victim").labels == {
                "node": "gpu-victim",
                "state": "ready",
            }
            routed = matching(samples, "kcoral_router_routed_requests_total")
            assert len(routed) == len(nodes) and {s.value for s in routed} == {0.0}, routed
            # No made-up series, label name or oversized label value; a repeated sample once.
            assert not [s for s in samples if "evil" in s.name or "secret" in s.labels]
            assert only(samples, "kcoral_requests_total", node="gpu-rogue").value == 7
            # A label value is a server's word or other: new words cannot add series.
            made_up = only(samples, "kcoral_worker_starts_total", node="gpu-rogue")
            assert made_up.labels["gpu"] == "other" and made_up.value == 4
            # Refused whole, counted, and the node keeps serving.
            for node_id, reason in (
                ("gpu-big", "too_large"),
                ("gpu-many", "too_many_samples"),
                ("gpu-junk", "unparsable"),
            ):
                refused = matching(
                    samples, "kcoral_router_node_metrics_refused_total", node=node_id
                )
                assert {s.labels["reason"] for s in refused if s.value} == {reason}
                assert not matching(samples, "kcoral_worker_starts_total", node=node_id)
                state = only(samples, "kcoral_router_node_state", node=node_id)
                assert state.labels["state"] == "ready"
            for node in nodes[:-1]:  # each still takes work (asked for by name; default kind)
                answer = await http_request(
                    router.port, "POST", "/execute", b"a program", [("X-KCoral-Node", node.node_id)]
                )
                assert answer.status == 200 and answer.header("X-KCoral-Node") == node.node_id
        finally:
            for node in nodes:
                await node.close()

    try:
        asyncio.run(scenario())
        router.lines_after_mark()  # every answered request's line is in
        assert "Traceback" not in router.log()
    finally:
        router.stop()
