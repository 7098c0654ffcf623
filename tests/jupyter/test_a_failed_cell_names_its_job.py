"""A cell that fails on the server names its job, the id the panel, ``%kcoral jobs`` and
``%kcoral attach`` know it by. Its error said ``RemoteCellError: Remote execution
07517876-... failed: runtime: ValueError: bad value 3``, the server's request id, while the
panel listed the same failure as ``job e7397c02``. The shell of the Jupyter tests against
a real CPU server."""

from __future__ import annotations

import json

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.runner import RemoteCellError

import kcoral

pytestmark = pytest.mark.timeout(300)


def test_a_failed_cells_error_names_the_job_the_server_lists(shell, cpu_server_url) -> None:
    with capture_output(), pytest.raises(RemoteCellError) as failed:
        shell.run_cell_magic("kcoral", "", "raise ValueError('bad value 3')\n")
    first = failed.value._render_traceback_()[0]
    with kcoral.Client(cpu_server_url) as client:
        listed = json.loads(bytes(client.request("GET", "/v1/jobs").data))
    job = next(j for j in listed if j["job_id"] in first)  # a job the server lists
    assert job["status"] == "FAILED"
    assert first == (
        f"RemoteCellError: job {job['job_id']} on {cpu_server_url} failed: "
        "runtime: ValueError: bad value 3"
    )
    assert job["request_id"] not in first
