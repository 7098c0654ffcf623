"""The jobs table and output pane of JupyterLab's KCoral panel, in a real browser, for the
job states a plain CPU server never shows (issue 40's look at every state): a job that has
its worker but waits for its GPUs (a real fake-GPU server: two workers share one GPU, and
one program holds it), and a failed job whose error holds a path longer than the panel is
wide, under a server name longer than the panel is wide. Headless Chromium drives
``lab_job_states.cjs``; JupyterLab, the server extension and the KCoral server are real.
Screenshots go to the test's temporary folder (or ``KCORAL_SCREENSHOT_DIR``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_browser import _free_port, _missing, _run_script, _running_lab, _screenshot_dir

import kcoral

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]

SCRIPT = Path(__file__).with_name("lab_job_states.cjs")
LONG_NAME = "gpu-cluster-west-europe-production-a100-80gb-pool-of-the-vision-team-nightly-runs"
ONE_SHARED_FAKE_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "2"]
HOLD_SOURCE = (
    "import os, time\n\n"
    "def main(path):\n"
    "    print('holding the GPU', flush=True)\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.05)\n"
    "    return 1\n"
)
# A path with nowhere to break, then the words that say what went wrong.
LONG_ERROR_SOURCE = (
    "def main():\n"
    "    raise ValueError('cannot read /data/runs/' + 'a1b2c3d4' * 40 + '/checkpoint.pt: "
    "its header says version 7')\n"
)


def _program(source: str, args: list | None = None) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=source)
    function = program.get_function(module=module, name="main")
    program.return_(key="x", value=program.run(fn=function, args=args))
    return program


def _state(client: kcoral.Client, job_id: str) -> dict:
    return json.loads(bytes(client.request("GET", f"/v1/jobs/{job_id}").data))


@pytest.mark.timeout(420)
def test_a_job_waiting_for_its_gpus_says_so_and_a_long_error_wraps_in_the_panel(
    tmp_path: Path, server_factory
) -> None:
    server = server_factory(*ONE_SHARED_FAKE_GPU)
    closed_url = f"http://127.0.0.1:{_free_port()}"
    client = kcoral.Client(server.url)
    release = tmp_path / "release"
    failed = client.submit(_program(LONG_ERROR_SOURCE))
    failed.result()
    assert _state(client, failed.id)["status"] == "FAILED"
    holders = [client.submit(_program(HOLD_SOURCE, [str(release)])) for _ in "ab"]
    try:
        # Either may take the GPU first; the other waits for it.
        deadline = time.monotonic() + 90
        while True:
            waiting = [j for j in holders if _state(client, j.id).get("waiting_for") == "gpus"]
            if waiting:
                break
            assert time.monotonic() < deadline, [_state(client, j.id) for j in holders]
            time.sleep(0.1)
        waiter = waiting[0]
        root = tmp_path / "root"
        root.mkdir()
        # Two servers: the jobs stand under a row naming theirs, here a long name.
        servers = [{"name": LONG_NAME, "url": server.url}, {"name": "gone", "url": closed_url}]
        with _running_lab(tmp_path, root, servers) as url:
            seen = _run_script(SCRIPT, url, tmp_path, WAITING_JOB=waiter.id, FAILED_JOB=failed.id)
        waiting_state = _state(client, waiter.id)
    finally:
        release.write_text("go")
    # The server still said the job waited when the browser had looked (its record is the
    # truth the panel shows), and the panel said so: not `running`, as if it ran.
    assert (waiting_state["status"], waiting_state["waiting_for"]) == ("RUNNING", "gpus")
    assert seen["waitingRow"]["cells"][0] == "GPU wait", seen["waitingRow"]
    assert "waiting for its GPUs" in seen["waitingRow"]["title"]
    assert seen["waitingPane"]["title"] == f"waiting for GPU · job {waiter.id[:8]}"
    assert seen["waitingPane"]["phase"] == "waiting for the GPU lease", seen["waitingPane"]
    assert seen["waitingFit"]["cut"] == [], seen["waitingFit"]  # the Worker header read `W…`
    # Why the job failed wraps inside the panel: the path ran past its edge and the whole
    # panel scrolled sideways (1315 px wide in a 250 px side bar).
    assert "ValueError: cannot read /data/runs/a1b2c3d4" in seen["failedPane"]["phase"]
    assert seen["failedPane"]["phaseFits"], seen["failedPane"]
    # The long server name wraps in the row naming it: it ran on in one line, and the
    # table's Time column went past the panel's edge.
    fit = seen["fitNarrow"]
    assert fit["tableScrollWidth"] <= fit["panelClientWidth"], fit
    assert fit["panelScrollWidth"] <= fit["panelClientWidth"], fit
    assert fit["overflowing"] == [] and fit["cut"] == [], fit
    assert (_screenshot_dir(tmp_path) / "waiting-for-gpu.png").exists()
    assert all(job.result() is not None for job in holders)
