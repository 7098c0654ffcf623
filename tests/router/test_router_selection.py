"""Which nodes a request may go to (``kcoral_server.router.admission.selection``, ROUTER §6,
§7, §13) and
how the admission queue serves waiters with selectors, on the router's own registry: what a
node offers, the default kind without a selector, sessions by GPU count, the bounded
``no_matching_node`` message, and a queue where a waiter for busy nodes of one kind never
holds back a waiter for another. The same rules through a real router onto real nodes:
``test_router_selectors.py``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.router.admission.scheduler import Admission, NoNode
from kcoral_server.router.admission.selection import (
    fleet_offers,
    no_match_message,
    node_offers,
    offering_nodes,
    serves,
    session_nodes,
)
from kcoral_server.router.nodes.registry import Registry
from kcoral_server.router.nodes.slot import RouterSlot
from kcoral_server.router.settings import RouterSettings


class QuietContext:
    async def write(self, frame: Any) -> None:
        pass


def join(registry: Registry, node: str, gpu: str, gpus: int = 1, **labels: str) -> RouterSlot:
    """A ready node with one worker slot (a published supervisor's when ``gpu`` is "")."""
    stream = registry.attach_supervisor(node)
    assert stream is not None
    status = pb.SupervisorStatus(
        node_id=node,
        server_healthy=True,
        supervisor_instance_id="sup",
        server_instance_id="inst",
        worker_count=1,
        health_age_millis=5,
    )
    if gpu:
        arch = "" if gpu == "cpu" else "sm_90a"
        status.kind.CopyFrom(pb.NodeKind(gpu=gpu, arch=arch, gpus=gpus))
    status.labels.update(labels)
    registry.apply_status(stream, status)
    slot = RouterSlot(node, str(uuid.uuid4()), "inst", QuietContext(), kind="worker")
    assert registry.add_slot(slot) is None
    return slot


def test_a_node_offers_its_labels_and_the_built_in_keys() -> None:
    registry = Registry(RouterSettings())
    join(registry, "h1", "h100", 2, pool="big")
    join(registry, "old", "")
    assert node_offers(registry.nodes["h1"]) == {
        "pool": "big",
        "gpu": "h100",
        "arch": "sm_90a",
        "gpus": "2",
        "node": "h1",
    }
    assert node_offers(registry.nodes["old"]) == {"gpus": "0", "node": "old"}
    h1 = registry.nodes["h1"]
    assert serves(h1, {"gpus": "1"}, None) and serves(h1, {"gpus": "2", "pool": "big"}, None)
    assert not serves(h1, {"gpus": "3"}, None) and not serves(h1, {"rack": "r1"}, None)
    assert serves(h1, {}, "h100") and not serves(h1, {}, "cpu")  # no selector: default kind


def test_a_selector_reaches_every_kind_and_an_affinity_never_overrides_it() -> None:
    registry = Registry(RouterSettings())
    join(registry, "c1", "cpu")
    join(registry, "h1", "h100", pool="big")
    join(registry, "a1", "a100")
    for selector, node in (({"gpu": "h100"}, "h1"), ({"pool": "big"}, "h1"), ({}, "c1")):
        lease = registry.select("a1", "r", selector)  # a preference for a1 is not followed
        assert lease is not None and lease[0].node_id == node
        registry.release(lease[1])
    lease = registry.select("a1", "r", {"gpu": "a100"})
    assert lease is not None and lease[0].node_id == "a1"
    assert registry.select(None, "r2", {"gpu": "a100"}) is None  # a1's only slot is busy
    assert [n.node_id for n in offering_nodes(registry, {"gpu": "a100"})] == ["a1"]  # busy counts


def test_a_waiter_for_busy_nodes_of_one_kind_does_not_hold_back_another_kind() -> None:
    async def scenario() -> None:
        registry = Registry(RouterSettings())
        join(registry, "c1", "cpu")
        h100 = join(registry, "h1", "h100")
        join(registry, "a1", "a100")
        admission = Admission(registry, max_queued=10, wait_timeout=5)
        registry.on_change = admission.wake
        busy = await admission.acquire(None, "first", {"gpu": "h100"})
        assert busy[1] is h100
        waiting = asyncio.ensure_future(admission.acquire(None, "second", {"gpu": "h100"}))
        behind = asyncio.ensure_future(admission.acquire(None, "third", {"gpu": "h100"}))
        await asyncio.sleep(0)
        assert admission.waiting == 2
        other = await asyncio.wait_for(admission.acquire(None, "fourth", {"gpu": "a100"}), 1)
        assert other[0].node_id == "a1"  # served at once, past the h100 waiters
        registry.release(busy[1])  # the h100 slot frees: the oldest h100 waiter gets it
        second = await asyncio.wait_for(waiting, 1)
        assert second[1] is h100 and not behind.done()
        registry.release(second[1])
        assert (await asyncio.wait_for(behind, 1))[1] is h100

    asyncio.run(scenario())


def test_a_waiter_whose_nodes_never_free_ends_with_no_node_as_before() -> None:
    async def scenario() -> None:
        registry = Registry(RouterSettings())
        join(registry, "h1", "h100")
        admission = Admission(registry, max_queued=10, wait_timeout=0.05)
        await admission.acquire(None, "holder", {"gpu": "h100"})
        try:
            await admission.acquire(None, "late", {"gpu": "h100"})
        except NoNode:
            return
        raise AssertionError("a waiter past its wait must end with NoNode")

    asyncio.run(scenario())


def test_sessions_go_to_nodes_with_enough_gpus_or_else_to_those_with_the_most() -> None:
    registry = Registry(RouterSettings())
    join(registry, "f1", "fake", 1)
    join(registry, "f2", "fake", 2)
    join(registry, "f4", "fake", 4)
    join(registry, "old", "")  # a published supervisor: no count, another (empty) kind
    ids = lambda nodes: sorted(n.node_id for n in nodes)  # noqa: E731
    assert ids(session_nodes(registry, {}, None)) == ["f1", "f2", "f4"]
    assert ids(session_nodes(registry, {}, 2)) == ["f2", "f4"]
    assert ids(session_nodes(registry, {}, 8)) == ["f4"]  # its 400 names its 4 GPUs
    assert ids(session_nodes(registry, {"node": "old"}, 8)) == ["old"]  # not filtered
    assert session_nodes(registry, {"gpu": "h100"}, 1) == []


def test_the_no_matching_node_message_names_the_selector_and_the_offers_bounded() -> None:
    registry = Registry(RouterSettings())
    join(registry, "c1", "cpu", 0, pool="small")
    join(registry, "h1", "h100", 1, pool="big")
    join(registry, "h2", "h100", 1)
    join(registry, "old", "")
    assert no_match_message(registry, {"gpu": "b200", "gpus": "2"}) == (
        "no ready node offers the selector gpu=b200,gpus=2; the fleet offers "
        "a node of no kind: 1 node, gpu=cpu,gpus=0: 1 node, gpu=h100,gpus=1: 2 nodes, "
        "pool=big: 1 node, pool=small: 1 node"
    )
    assert fleet_offers([]) == "the fleet has no ready node"
    crowded = Registry(RouterSettings())
    for i in range(40):
        join(crowded, f"n{i}", "h100", 1, **{f"k{i}": "v"})
    message = fleet_offers(crowded.nodes.values())
    assert message.endswith("and 17 more") and len(message) < 1000
