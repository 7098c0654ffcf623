"""The JupyterLab panel in real Chromium against a real router with two real CPU nodes, one
of them stopped (SIGSTOP): the fleet row says ``1/2 ready · 1 unhealthy`` (ROUTER §6
``fleet_status.not_ready``), where the stopped node simply vanished from the table, and
the row still fits the narrow panel; at 250 px no word of a kind or label breaks."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from test_browser import ROOT, _missing, _run_script, _running_lab, _screenshot_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]

SCRIPT = Path(__file__).with_name("lab_fleet_not_ready.cjs")


@pytest.mark.timeout(420)
def test_the_panel_says_a_stopped_node_beside_its_kinds_ready_count(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "router"))
    from raw_http import request
    from router_helpers import Node, ready_nodes, start_router, stopping

    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.3", "--max-status-age-seconds", "3"
    )
    nodes = [Node(tmp_path, router, name, None) for name in ("cpu-a", "cpu-b")]
    with stopping(router, nodes):
        ready_nodes(router, 2)
        os.kill(nodes[1].process.pid, signal.SIGSTOP)  # its supervisor's statuses stop
        try:
            deadline = time.monotonic() + 60
            while request(router.url, "GET", "/v1/info").body.get("fleet_status", {}).get(
                "not_ready"
            ) != [
                {"gpu": "cpu", "arch": None, "gpus": 0, "default": True, "states": {"unhealthy": 1}}
            ]:
                assert time.monotonic() < deadline, router.log()
                time.sleep(0.2)
            root = tmp_path / "root"
            root.mkdir()
            with _running_lab(tmp_path, root, [{"name": "fleet", "url": router.url}]) as url:
                seen = _run_script(SCRIPT, url, tmp_path)
        finally:
            os.kill(nodes[1].process.pid, signal.SIGCONT)
    assert seen["rows"][0][:2] == ["gpu=cpu", "1/2 ready · 1 unhealthy"], seen["rows"]
    fit = seen["fitNarrow"]
    assert fit["panelScrollWidth"] <= fit["panelClientWidth"], fit
    assert fit["overflowing"] == [], fit
    assert (_screenshot_dir(tmp_path) / "fleet-not-ready.png").exists()
    # 250 px wide, `gpu=cpu` and the longest names a fleet shows break only between words
    # or after a hyphen (it showed `gpu=c` over `pu`), and the panel needs no sideways scroll
    # (the long names with every node ready: `· 1 unhealthy` beside them is 20 px too wide).
    narrow = seen["narrowNames"]
    assert narrow["panelWidth"] == 250, narrow
    names = narrow["names"]
    assert ["".join(lines) for lines in names] == [
        "gpu=cpu",
        "gpu=a100-sxm4-80gb ×8",
        "arch=sm_90",
        "gpu=cpu (default)",
    ], names
    assert names[0] == ["gpu=cpu"], names
    assert all(line.endswith((" ", "-")) for lines in names for line in lines[:-1]), names
    for fit in (seen["fit250"], seen["fit250AllReady"]):
        assert fit["panelScrollWidth"] <= fit["panelClientWidth"], fit
        assert fit["overflowing"] == [], fit
