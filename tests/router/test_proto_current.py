"""The committed generated gRPC modules match ``kcoral_gateway.proto``."""

from __future__ import annotations

from pathlib import Path

import pytest
from kcoral_server.proto import regenerate


def test_the_committed_generated_modules_are_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    for path in regenerate.generate(tmp_path):
        committed = regenerate.HERE / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed.name} is stale: run python -m kcoral_server.proto.regenerate"
        )


def test_the_proto_keeps_the_normative_field_numbers() -> None:
    from kcoral_server.proto import kcoral_gateway_pb2 as pb

    status = pb.SupervisorStatus.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in status.items()} == {
        "node_id": 1,
        "server_healthy": 2,
        "supervisor_instance_id": 3,
        "server_instance_id": 4,
        "worker_count": 8,
        "busy_workers": 9,
        "target": 11,
        "versions": 12,
        "last_error": 13,
        "health_age_millis": 14,
        "slot_key": 15,  # added 2026-12 (ROUTER §12)
        "kind": 16,  # added 2026-12 (ROUTER §6)
        "labels": 17,  # added 2026-12 (ROUTER §6)
        "node_metrics": 18,  # added 2026-12 (ROUTER §4, EXTENSIONS §13)
        "lease_stats": 19,  # added 2026-12 (ROUTER §6)
        "draining": 20,  # added 2026-12 (ROUTER §6)
    }
    lease_stats = pb.LeaseStats.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in lease_stats.items()} == {
        "count": 1,
        "seat_held_mean_ms": 2,
        "seat_held_p50_ms": 3,
        "lease_held_mean_ms": 4,
        "lease_held_p50_ms": 5,
        "queued": 6,
    }
    kind = pb.NodeKind.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in kind.items()} == {
        "gpu": 1,
        "arch": 2,
        "memory_bytes": 3,
        "gpus": 4,
        "product": 5,
    }
    hello = pb.SlotHello.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in hello.items()} == {
        "node_id": 1,
        "server_instance_id": 2,
        "slot_id": 3,
        "protocol_version": 4,
        "slot_key": 5,  # added 2026-12 (ROUTER §12)
        "max_control_slots": 6,  # added 2026-12 (ROUTER §7)
    }
    frame = pb.SlotFrame.DESCRIPTOR.fields_by_name
    assert {name: f.number for name, f in frame.items()} == {
        "request_id": 1,
        "hello": 2,
        "request_head": 3,
        "data": 4,
        "end": 5,
        "response_head": 6,
        "cancel": 7,
        "ack": 8,
    }
    assert pb.DESCRIPTOR.services_by_name["RouterGateway"].full_name == (
        "kcoral.gateway.v1.RouterGateway"
    )
