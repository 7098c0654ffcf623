"""docs/scaling.md "Mixed fleets" runs as written: its bash blocks, run one after the other in
one shell (a real router and two real CPU nodes told apart by their labels), print what the
text around them says. Only the port (a free one instead of 9000) and the directory (the
test's own instead of /tmp/kcoral-fleet) change; the block marked as needing selectors runs
where the client has them (issue 33 point 2)."""

from __future__ import annotations

import inspect
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_files import ROOT

import kcoral

pytestmark = pytest.mark.slow

DOCS = ROOT / "docs" / "scaling.md"
NEEDS_SELECTORS = "<!-- run-through: needs selectors (issue 33 point 2) -->"
# A bound for a run-through that hangs (a node that never gets ready), not a measurement:
# on a quiet machine the blocks take seconds.
HANG_SECONDS = 300


def section() -> str:
    text = DOCS.read_text()
    start = text.index("## Mixed fleets\n")
    return text[start : text.index("\n## ", start + 1)]


def blocks() -> list[tuple[bool, str]]:
    """Each bash block of the section, and whether it is marked as needing selectors."""
    found = re.findall(r"(<!--[^\n]*-->\n)?```bash\n(.*?)```", section(), re.S)
    return [(marker.strip() == NEEDS_SELECTORS, body) for marker, body in found]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_blocks(tmp_path: Path, with_selectors: bool) -> str:
    """The section's blocks as one bash script in ``tmp_path``, its output."""
    script = "\n".join(body for needs, body in blocks() if with_selectors or not needs)
    port = str(free_port())
    script = script.replace("127.0.0.1:9000", f"127.0.0.1:{port}")
    script = script.replace("--port 9000", f"--port {port}")
    script = script.replace("/tmp/kcoral-fleet", str(tmp_path / "fleet"))
    assert "9000" not in script
    # The kcoral and python3 of this environment, as a user's activated venv gives them.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    process = subprocess.Popen(
        ["bash", "-e", "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        output = "(hung)"
    finally:
        # Whatever the blocks left running (they stop their own processes when they finish).
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    logs = "".join(
        f"\n--- {log.name}\n{log.read_text()[-3000:]}" for log in (tmp_path / "fleet").glob("*.log")
    )
    assert process.returncode == 0, output + logs
    return output


def test_the_run_through_tells_a_user_nothing_that_is_only_for_tests() -> None:
    assert "KCORAL_TEST" not in section()
    assert [needs for needs, _body in blocks()] == [False, True, False]
    # The Python a user pastes is Python, where it runs and where it waits for selectors.
    for _needs, body in blocks():
        for code in re.findall(r"python3 -c '(.*?)'", body, re.S):
            compile(code, "docs/scaling.md", "exec")


def test_the_mixed_fleet_run_through_shows_the_fleet_and_serves_a_published_client(
    tmp_path: Path,
) -> None:
    lines = run_blocks(tmp_path, with_selectors=False).splitlines()
    fleet = {
        "kinds": [{"gpu": "cpu", "arch": None, "gpus": 0, "nodes": 2, "default": True}],
        "labels": [
            {"key": "zone", "value": "a", "nodes": 1},
            {"key": "zone", "value": "b", "nodes": 1},
        ],
    }
    assert str(fleet) in lines
    # The program's answer, then the node the router's log names for it.
    assert "1" in lines
    assert lines[-1] in {"node=cpu-a", "node=cpu-b"}


def test_the_mixed_fleet_run_through_selects_a_node_by_its_label(tmp_path: Path) -> None:
    if "select" not in inspect.signature(kcoral.Client.execute).parameters:
        pytest.skip("Client.execute has no select= yet (selectors, issue 33 point 2)")
    lines = run_blocks(tmp_path, with_selectors=True).splitlines()
    at = lines.index("cpu-b")
    refused = lines[at + 1]
    assert refused.startswith("503 ") and "zone=c" in refused
