"""What a node's supervisor says of itself (ROUTER §6): its kind and labels in every status,
never a healthy status before the kind is known, and the labels kept from its child."""

from __future__ import annotations

import json
import shutil

from kcoral_server.gpu.kind import NodeKind
from kcoral_server.node.supervisor import (
    NODE_KIND_OVERRIDE_ENV,
    Supervisor,
    child_arguments,
    probe_kind,
)
from kcoral_server.settings.command_line import parse_server_args

NODE = ["--router", "http://127.0.0.1:9000", "--node-id", "n1", "--device", "cpu"]


def supervisor(argv: list[str], environ: dict[str, str]) -> Supervisor:
    settings = parse_server_args(argv, environ)
    made = Supervisor(settings, argv, environ)
    shutil.rmtree(made.workdir, ignore_errors=True)
    return made


def test_a_status_carries_kind_and_labels_and_is_healthy_once_the_kind_is_known() -> None:
    argv = [*NODE, "--node-label", "pool=big", "--node-label=rack=r2"]
    made = supervisor(argv, {})
    made.healthy, made.child = True, None
    assert made.node_kind is None and not made.status().server_healthy
    assert dict(made.status().labels) == {"pool": "big", "rack": "r2"}
    assert made.status().kind.gpu == ""
    made.node_kind = probe_kind(made.settings)
    assert made.node_kind == NodeKind("cpu")
    assert made.status().kind.gpu == "cpu" and made.status().kind.gpus == 0


def test_the_test_only_override_names_another_kind() -> None:
    kind = {"gpu": "h100", "arch": "sm_90a", "memory_bytes": 1 << 30, "gpus": 2}
    made = supervisor(NODE, {NODE_KIND_OVERRIDE_ENV: json.dumps(kind)})
    reported = made.status().kind
    assert (reported.gpu, reported.arch, reported.memory_bytes, reported.gpus) == (
        "h100",
        "sm_90a",
        1 << 30,
        2,
    )


def test_labels_stay_with_the_supervisor_and_do_not_reach_the_child() -> None:
    argv = [*NODE, "--node-label", "pool=big", "--node-label=rack=r2", "--num-workers", "2"]
    assert child_arguments(argv) == ["--device", "cpu", "--num-workers", "2"]
