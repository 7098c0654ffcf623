"""One compatibility baseline per node kind (ROUTER §6), on the router's registry and its
status checks: nodes of one kind must agree, kinds may differ, requests without a selector
go to the default kind (the first kind with a healthy node), and a node cannot make the
router keep malformed or unbounded kinds and labels."""

from __future__ import annotations

import time
import uuid
from typing import Any

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.admission.selection import fleet
from kcoral_server.router.nodes.gateway import status_problem
from kcoral_server.router.nodes.registry import Registry
from kcoral_server.router.nodes.slot import CONTROL, RouterSlot
from kcoral_server.router.settings import RouterSettings


class QuietContext:
    async def write(self, frame: Any) -> None:
        pass


def status(
    node: str, gpu: str, versions: dict[str, str], labels: dict[str, str] | None = None, **more: str
) -> pb.SupervisorStatus:
    message = pb.SupervisorStatus(
        node_id=node,
        server_healthy=True,
        supervisor_instance_id="sup",
        server_instance_id="inst",
        worker_count=1,
        health_age_millis=5,
    )
    if gpu:  # a published supervisor sends no kind
        message.kind.CopyFrom(pb.NodeKind(gpu=gpu, arch="" if gpu == "cpu" else "sm_90a", gpus=1))
    message.versions.update(versions)
    message.labels.update({**(labels or {}), **more})
    return message


def join(registry: Registry, node: str, gpu: str, torch: str = "1", **labels: str) -> None:
    stream = registry.attach_supervisor(node)
    assert stream is not None
    registry.apply_status(stream, status(node, gpu, {"torch": torch}, **labels))
    for kind in ("worker", CONTROL):
        slot = RouterSlot(node, str(uuid.uuid4()), "inst", QuietContext(), kind=kind)
        assert registry.add_slot(slot) is None


def test_each_kind_has_its_own_baseline_and_the_first_is_the_default() -> None:
    registry = Registry(RouterSettings())
    join(registry, "h1", "h100", torch="2.5")
    join(registry, "a1", "a100", torch="2.4")  # another kind may differ
    join(registry, "h2", "h100", torch="2.4")  # one kind must agree
    states = {n: r.state for n, r in registry.nodes.items()}
    assert states == {"h1": "ready", "a1": "ready", "h2": "incompatible"}
    assert registry.default_kind == "h100"
    assert registry.baseline == ({}, {"torch": "2.5"})
    assert registry.baselines["a100"] == ({}, {"torch": "2.4"})


def test_requests_without_a_selector_go_only_to_the_default_kind() -> None:
    registry = Registry(RouterSettings())
    join(registry, "a1", "a100")
    join(registry, "h1", "h100")
    for i in range(6):
        lease = registry.select(None, f"r{i}")
        if lease is None:
            break
        assert lease[0].node_id == "a1"
        registry.release(lease[1])
    # An affinity to a node of another kind does not take a request there.
    lease = registry.select("h1", "pinned")
    assert lease is not None and lease[0].node_id == "a1"
    registry.release(lease[1])
    control = registry.select_control(None, "info")
    assert control is not None and control[0].node_id == "a1"
    assert [n.node_id for n in registry.control_nodes(ready_only=True)] == ["a1"]
    assert {n.node_id for n in registry.control_nodes(ready_only=False)} == {"a1", "h1"}
    assert registry.capacity() == 1 and registry.any_ready_with_slots()


def test_the_default_kind_moves_on_when_its_last_node_is_forgotten() -> None:
    registry = Registry(RouterSettings(node_retention_seconds=6, max_status_age_seconds=5))
    join(registry, "a1", "a100")
    join(registry, "h1", "h100")
    registry.detach_supervisor(registry.nodes["a1"].stream)  # type: ignore[arg-type]
    registry.nodes["a1"].lost_at = time.monotonic() - 3600
    registry.check()
    assert "a1" not in registry.nodes and registry.default_kind == "h100"
    lease = registry.select(None, "r")
    assert lease is not None and lease[0].node_id == "h1"


def test_info_counts_ready_nodes_by_kind_and_label_the_default_first() -> None:
    registry = Registry(RouterSettings())
    join(registry, "c1", "cpu", pool="small")
    join(registry, "h1", "h100", pool="big")
    join(registry, "h2", "h100", pool="big", rack="r2")
    assert fleet(registry) == {
        "kinds": [
            {"gpu": "cpu", "arch": None, "gpus": 1, "nodes": 1, "default": True},
            {"gpu": "h100", "arch": "sm_90a", "gpus": 1, "nodes": 2, "default": False},
        ],
        "labels": [
            {"key": "pool", "value": "big", "nodes": 2},
            {"key": "pool", "value": "small", "nodes": 1},
            {"key": "rack", "value": "r2", "nodes": 1},
        ],
    }


def test_a_published_supervisor_without_a_kind_keeps_todays_single_baseline() -> None:
    registry = Registry(RouterSettings())
    join(registry, "old1", "")
    join(registry, "old2", "", torch="2")
    assert registry.default_kind == ""
    assert registry.nodes["old2"].state == "incompatible"
    assert fleet(registry)["kinds"] == [
        {"gpu": None, "arch": None, "gpus": 0, "nodes": 1, "default": True}
    ]


def test_a_status_with_a_malformed_or_unbounded_kind_or_labels_is_invalid() -> None:
    settings = RouterSettings()
    assert status_problem(status("n", "h100", {}, pool="big"), settings, None) is None
    assert status_problem(status("n", "", {}), settings, None) is None
    for gpu in ("H100", "h-100", "x" * 33):
        assert "kind" in (status_problem(status("n", gpu, {}), settings, None) or "")
    long_product = status("n", "h100", {})
    long_product.kind.product = "p" * 129
    assert status_problem(long_product, settings, None)
    shadowing = status("n", "h100", {}, {"gpu": "a100"})
    assert "built in" in (status_problem(shadowing, settings, None) or "")
    crowded = status("n", "h100", {}, **{f"k{i}": "v" for i in range(17)})
    assert "labels" in (status_problem(crowded, settings, None) or "")
    assert status_problem(status("n", "h100", {}, pool="a b"), settings, None)
