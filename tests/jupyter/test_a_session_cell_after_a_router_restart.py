"""A notebook's session through a router that restarts between two cells (SIGTERM, started
again on its port, as systemd does): the next cell, run at once, runs in the session with
its state, where it failed with the restarted router's 503 ``session not found yet`` for
the second the session's node took to reconnect (ROUTER §13, EXTENSIONS §11). A real
kernel (nbclient), a real router and a real CPU node."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_cells import shown

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import Node, ready_nodes, stopping
from test_router_restart_grace import NODE_ENV, TOKEN, free_port, router_on

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_session_cell_run_right_after_a_router_restart_keeps_the_sessions_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCORAL_TOKEN", TOKEN)  # the kernel's token
    monkeypatch.delenv("KCORAL_URL", raising=False)
    port = free_port()
    router = router_on(tmp_path, port)
    node = Node(tmp_path, router, "only", NODE_ENV)
    restarted = []
    sources = [
        "%load_ext kcoral",
        f"%kcoral connect {router.url}",
        "%kcoral session start",
        "%%kcoral\nx = 20\n",
        "%%kcoral\nx * 2 + 1\n",  # 4: right after the restart
        "%kcoral session stop",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    kernel = NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    with stopping(router, [node]):
        ready_nodes(router, 1)
        try:
            with kernel.setup_kernel():
                for index, cell in enumerate(notebook.cells):
                    if index == 4:
                        router.stop()
                        restarted.append(router_on(tmp_path, port))
                    kernel.execute_cell(cell, index)
        finally:
            for later in restarted:
                later.stop()
    errors = [o for c in notebook.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, shown(notebook.cells[4])
    assert "41" in shown(notebook.cells[4])
