"""A ``%%kcoral`` cell whose job is cancelled from outside it (the KCoral panel's Cancel,
``%kcoral cancel`` in another notebook) says so, without the advice for an interrupt. It
said ``the job was cancelled on http://...`` and ``run the cell again; --noblock runs it
as a job that an interrupt leaves alone``, though nobody had interrupted the kernel. The
shell of the Jupyter tests against a real CPU server; the cancel comes from a client of
that server, as the panel's does."""

from __future__ import annotations

import json
import threading
import time

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import CellCancelledError

import kcoral

pytestmark = pytest.mark.timeout(300)


def cancel_the_running_job(url: str, before: set[str], cancelled: list[str]) -> None:
    """Cancel the first job not in ``before`` once the server says it runs."""
    with kcoral.Client(url) as client:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            listed = json.loads(bytes(client.request("GET", "/v1/jobs").data))
            running = [j for j in listed if j["job_id"] not in before and j["status"] == "RUNNING"]
            if running:
                client.job(running[0]["job_id"]).cancel()
                cancelled.append(running[0]["job_id"])
                return
            time.sleep(0.05)


def test_a_job_cancelled_from_outside_the_cell_is_not_called_an_interrupt(
    shell, cpu_server_url
) -> None:
    with kcoral.Client(cpu_server_url) as client:
        before = {j["job_id"] for j in json.loads(bytes(client.request("GET", "/v1/jobs").data))}
    cancelled: list[str] = []
    canceller = threading.Thread(
        target=cancel_the_running_job, args=(cpu_server_url, before, cancelled)
    )
    canceller.start()
    try:
        with capture_output(), pytest.raises(CellCancelledError) as failed:
            shell.run_cell_magic("kcoral", "", "import time\ntime.sleep(120)\n")
    finally:
        canceller.join(150)
    assert cancelled, "the cell's job was never seen running"
    cause, action = failed.value._render_traceback_()
    assert cause == (
        f"CellCancelledError: the job was cancelled on {cpu_server_url}, not by this cell"
    )
    assert "interrupt" not in action and "KCoral panel" in action, action
