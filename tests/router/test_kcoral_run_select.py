"""``kcoral run --select`` (CLIENT_API §11, EXTENSIONS §14) through a real router onto a
mixed fleet of real nodes, a CPU node and a fake-GPU node: the tool runs on the kind the
selector names, whichever kind is the router's default, and a selector no node offers ends
in the router's one line naming it and what the fleet offers (exit 1). Before, ``kcoral
run`` had no way to say it (``unknown option --select``, exit 2) and reached only the
router's default kind: a mixed fleet's other kinds were out of its reach."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from router_helpers import Node, RouterProcess, start_router, stopping

from kcoral.cli import main as kcoral_main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
NODES_ENV = {"KCORAL_NODE_TOKEN": "run-select-node-token"}
TOKEN = "run-select-client-token"


def ready_nodes(router: RouterProcess) -> set[str]:
    states: dict[str, str] = {}
    for line in router.log().splitlines():
        if " node_state " in line:
            states[line.split("node=")[1].split()[0]] = line.split(" state=")[1].split()[0]
    return {node for node, state in states.items() if state == "ready"}


def test_kcoral_run_select_runs_the_tool_on_the_kind_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "client-tokens"
    tokens.write_text(f"alice {TOKEN}\n")
    tokens.chmod(0o600)
    router = start_router(
        tmp_path,
        "--status-check-interval-seconds",
        "0.3",
        "--auth-token-file",
        str(tokens),
        env=NODES_ENV,
    )
    nodes = [
        Node(tmp_path, router, "cpu-a", NODES_ENV),
        Node(
            tmp_path, router, "fake-a", NODES_ENV, "--device", "fake-gpu", "--fake-gpu-count", "1"
        ),
    ]
    with stopping(router, nodes):
        deadline = time.monotonic() + 90
        while ready_nodes(router) != {"cpu-a", "fake-a"}:
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        monkeypatch.setenv("KCORAL_URL", router.url)
        monkeypatch.setenv("KCORAL_TOKEN", TOKEN)
        for kind, node in (("fake", "fake-a"), ("cpu", "cpu-a")):
            command = ["run", "shell", "--select", f"gpu={kind}", "--", "echo", f"ran {kind}"]
            assert kcoral_main(command) == 0
            assert capsys.readouterr().out == f"ran {kind}\n"
            router.lines_after_mark(TOKEN)
            submitted = [line for line in router.log().splitlines() if " path=/v1/jobs " in line]
            assert f" node={node} select=gpu={kind} " in submitted[-1], submitted

        assert kcoral_main(["run", "shell", "--select", "gpu=h100", "--", "true"]) == 1
        said = capsys.readouterr().err.strip().splitlines()
        assert said[-1].startswith(
            "kcoral run: no ready node offers the selector gpu=h100; the fleet offers "
            "gpu=cpu,gpus=0: 1 node, gpu=fake,gpus=1: 1 node; nothing was run"
        ), said
