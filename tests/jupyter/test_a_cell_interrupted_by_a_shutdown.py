"""A %%kcoral cell running when its kernel is shut down or restarted. Jupyter interrupts the
kernel first (jupyter_client's shutdown sends SIGINT, then a shutdown request, whose
handler in ipykernel sets ``shell.exit_now``): the cell's line must not say the kernel's
state is kept. An in-process IPython shell against a real CPU server (the ``shell``
fixture of ``conftest.py``)."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import CellCancelledError

from kcoral import Client

pytestmark = pytest.mark.timeout(300)


def _interrupt_once_running(client: Client, before: set[str], shutdown: bool, ip) -> None:
    """SIGINT to the shell's thread once the cell's job runs; with ``shutdown``, as a
    kernel shutdown does it (exit_now set by the shutdown request)."""
    main = threading.get_ident()

    def wait_then_interrupt() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(j["job_id"] not in before and j["status"] == "RUNNING" for j in client.jobs()):
                ip.exit_now = shutdown
                signal.pthread_kill(main, signal.SIGINT)
                return
            time.sleep(0.05)

    threading.Thread(target=wait_then_interrupt, daemon=True).start()


@pytest.mark.parametrize("shutdown", [True, False])
def test_a_cell_interrupted_by_its_kernels_shutdown_does_not_say_its_state_is_kept(
    shell, cpu_server_url, shutdown: bool
) -> None:
    # A soak: Kernel > Shut Down while a %%kcoral cell ran left the line `kcoral:
    # interrupted; the remote work was cancelled (kernel state kept)` in the notebook, and
    # the kernel, its state with it, was gone.
    with Client(cpu_server_url) as client:
        before = {job["job_id"] for job in client.jobs()}
        _interrupt_once_running(client, before, shutdown, shell)
        try:
            with capture_output() as captured:
                result = shell.run_cell("%%kcoral\nimport time\ntime.sleep(60)\n")
        finally:
            shell.exit_now = False
    assert isinstance(result.error_in_exec, CellCancelledError)
    lines = [o.data.get("text/plain", "") for o in captured.outputs]
    if shutdown:
        assert lines[-1] == (
            "kcoral: interrupted by the kernel's shutdown or restart; the remote work was cancelled"
        ), lines
    else:
        assert lines[-1] == (
            "kcoral: interrupted; the remote work was cancelled (kernel state kept)"
        ), lines
