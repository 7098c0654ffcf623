"""``%%kcoral`` and ``%kcoral`` in an in-process IPython shell against a real CPU server."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import PickleRefusedError
from kcoral_jupyter.runner import RemoteCellError
from stand_in_http import StandIn, serving

pytestmark = pytest.mark.timeout(300)


def run(ip: Any, source: str) -> tuple[Any, Any]:
    """Run a cell; (ExecutionResult, captured outputs)."""
    with capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def kcoral_metadata(captured: Any) -> list[dict]:
    return [o.metadata["kcoral"] for o in captured.outputs if (o.metadata or {}).get("kcoral")]


def test_inputs_are_bound_remotely_and_outputs_come_back_into_the_namespace(shell) -> None:
    shell.user_ns["x"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    shell.user_ns["n"] = 3
    shell.user_ns["blob"] = b"abc"
    result, captured = run(
        shell,
        "%%kcoral -i x,n -i blob -o y,z\nprint('scale', n)\ny = x * n\nz = blob[::-1].decode()\n",
    )
    assert result.error_in_exec is None, result.error_in_exec
    np.testing.assert_array_equal(np.asarray(shell.user_ns["y"]), np.arange(6).reshape(2, 3) * 3)
    assert shell.user_ns["z"] == "cba"
    assert "scale 3" in captured.stdout
    assert result.result is None


def test_a_final_expression_is_returned_like_ipython_does_and_carries_provenance(shell) -> None:
    result, captured = run(shell, "%%kcoral\nvalues = [1, 2, 3]\nsum(values) * 2\n")
    assert result.error_in_exec is None
    assert result.result == 12
    meta = kcoral_metadata(captured)
    assert meta and meta[-1]["status"] == "COMPLETED"
    assert meta[-1]["request_id"]
    assert set(meta[-1]["timings"]) >= {"queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"}
    assert meta[-1]["server"].startswith("http://127.0.0.1:")


def test_the_summary_line_says_the_cell_ran_on_cpu(shell) -> None:
    result, captured = run(shell, "%%kcoral\nx = 1\n")
    assert result.error_in_exec is None
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    assert any("COMPLETED" in t and "ran on CPU" in t for t in texts), texts


def test_the_summary_line_says_when_the_server_runs_programs_without_a_sandbox(shell) -> None:
    # The shared test server runs with --sandbox none (tests/server_process.py).
    result, captured = run(shell, "%%kcoral\nx = 1\n")
    assert result.error_in_exec is None
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    assert any(t.endswith(" · no sandbox") for t in texts), texts


def test_a_remote_failure_raises_with_the_remote_traceback(shell) -> None:
    result, _ = run(shell, "%%kcoral\ndef f():\n    return 1 / 0\nf()\n")
    error = result.error_in_exec
    assert isinstance(error, RemoteCellError)
    rendered = "\n".join(error._render_traceback_())
    assert "ZeroDivisionError" in rendered
    assert "return 1 / 0" in rendered
    assert "<uploaded:" not in rendered  # the generated wrapper's frames are hidden


def test_other_objects_travel_with_pickle_both_ways(shell) -> None:
    shell.user_ns["obj"] = {3, 1, 2}
    result, _ = run(shell, "%%kcoral -i obj -o y\ny = frozenset(obj) | {4}\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert shell.user_ns["y"] == frozenset({1, 2, 3, 4})


def test_an_input_whose_class_lives_in_a_helper_module_beside_the_notebook_arrives(
    shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The helper module went by reference: the server cannot import it, and the cell failed
    # with "ModuleNotFoundError: No module named 'notebook_helper_classes'".
    (tmp_path / "notebook_helper_classes.py").write_text(
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        helpers = importlib.import_module("notebook_helper_classes")
        shell.user_ns["pair"] = helpers.Pair(2, 3)
        result, _ = run(shell, "%%kcoral -i pair -o total\ntotal = pair.a + pair.b\n")
    finally:
        sys.modules.pop("notebook_helper_classes", None)
    assert result.error_in_exec is None, result.error_in_exec
    assert shell.user_ns["total"] == 5


def test_a_server_that_refuses_pickle_is_named_clearly(shell, json_only_server_url) -> None:
    shell.user_ns["obj"] = {1}
    result, _ = run(shell, f"%%kcoral --url {json_only_server_url} -i obj\nlen(obj)\n")
    assert isinstance(result.error_in_exec, PickleRefusedError)
    assert "does not allow pickle" in str(result.error_in_exec)


def test_torch_inputs_give_torch_outputs(shell) -> None:
    torch = pytest.importorskip("torch")
    shell.user_ns["t"] = torch.arange(4, dtype=torch.float32)
    result, _ = run(shell, "%%kcoral -i t -o y\ny = t + 1\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert isinstance(shell.user_ns["y"], torch.Tensor)
    assert shell.user_ns["y"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_files_go_up_and_returned_files_are_shown(shell, tmp_path: Path) -> None:
    source = tmp_path / "notes.txt"
    source.write_text("hello from the kernel\n")
    result, captured = run(
        shell,
        f"%%kcoral --file {source}:in/notes.txt --return-file out.txt --quiet\n"
        "open('out.txt', 'w').write(open('in/notes.txt').read().upper())\n",
    )
    assert result.error_in_exec is None, result.error_in_exec
    returned = shell.user_ns["_kcoral"]["file:out.txt"]
    assert returned.read_bytes() == b"HELLO FROM THE KERNEL\n"
    html = [o.data.get("text/html", "") for o in captured.outputs]
    assert any("HELLO FROM THE KERNEL" in h for h in html)


def _release_a_blocked_reader(fifo: Path) -> None:
    """Let a reader blocked opening ``fifo`` go on (it then reads an empty file)."""
    with contextlib.suppress(OSError):  # ENXIO: no reader is waiting
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_by_file_is_refused_without_blocking_the_kernel(shell, tmp_path: Path) -> None:
    # Path.read_bytes() waited for a writer that never came: the kernel hung. A bound lets
    # the old code's read go on (as an empty file) so the test fails instead of hanging.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    release = threading.Timer(60, _release_a_blocked_reader, [fifo])
    release.start()
    try:
        with pytest.raises(UsageError) as refused:
            shell.run_cell_magic("kcoral", f"--file {fifo}:in.txt", "1\n")
    finally:
        release.cancel()
    assert str(refused.value) == f"%%kcoral: --file '{fifo}' is a FIFO, not a regular file"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")
def test_a_proc_file_that_reports_size_zero_is_sent_whole(shell) -> None:
    result, _ = run(
        shell, "%%kcoral --file /proc/self/status:s.txt -o x\nx = open('s.txt').read()\n"
    )
    assert result.error_in_exec is None, result.error_in_exec
    assert shell.user_ns["x"].startswith("Name:")


def test_gpus_above_one_fail_clearly_on_a_cpu_server(shell) -> None:
    with pytest.raises(UsageError, match="needs a server with at least 2 GPUs"):
        shell.run_cell_magic("kcoral", "--gpus 2", "x = 1\n")


class PublishedProtocolOnly(StandIn):
    """A conforming server of the published protocol: `/health` and `/execute`, no `/v1/`."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_json(
                {
                    "status": "ok",
                    "instance_id": "stand-in",
                    "started_at": "2026-12-01T00:00:00.000000Z",
                    "gpu_count": 0,
                    "load": {
                        "request_capacity": 1,
                        "requests_in_progress": 0,
                        "requests_waiting": 0,
                    },
                    "target": {},
                    "versions": {},
                }
            )
        else:
            error = {"kind": "not_found", "message": "not found"}
            self.send_json({"status": "ERROR", "error": error}, 404)


@pytest.fixture
def published_protocol_server() -> Iterator[str]:
    with serving(PublishedProtocolOnly) as url:
        yield url


def test_noblock_on_a_server_without_the_jobs_api_says_so(shell, published_protocol_server) -> None:
    with pytest.raises(UsageError, match="needs the jobs API"):
        shell.run_cell_magic(
            "kcoral", f"--url {published_protocol_server} --noblock -r job", "x = 1\n"
        )


def test_an_unknown_input_name_is_a_usage_error(shell) -> None:
    with pytest.raises(UsageError, match="no such name"):
        shell.run_cell_magic("kcoral", "-i does_not_exist", "x = 1\n")


def test_a_timeout_says_which_limit_fired_and_how_to_change_it(shell) -> None:
    result, _ = run(shell, "%%kcoral --timeout 1\nimport time\ntime.sleep(30)\n")
    error = result.error_in_exec
    assert isinstance(error, TimeoutError)
    assert "--timeout 1 s" in str(error) and "--timeout SECONDS" in str(error)


def test_status_renders_health_and_info_and_never_the_token(shell) -> None:
    shell.run_line_magic("config", "KCoral.token = 'sekrit-token-123'")
    try:
        with capture_output() as captured:
            shell.run_line_magic("kcoral", "status")
    finally:
        shell.run_line_magic("config", "KCoral.token = ''")
    text = captured.stdout + "".join(str(o.data) for o in captured.outputs)
    assert "health.status" in text and "info.features" in text
    assert "sekrit-token-123" not in text


def test_config_sets_the_url_and_connect_switches_servers(shell, json_only_server_url) -> None:
    shell.run_line_magic("config", f"KCoral.url = '{json_only_server_url}'")
    with capture_output() as captured:
        shell.run_line_magic("kcoral", f"connect {json_only_server_url}")
    assert "connected to" in captured.stdout
    result, captured = run(shell, "%%kcoral\n40 + 2\n")
    assert result.result == 42
    assert kcoral_metadata(captured)[-1]["server"] == json_only_server_url


def test_a_cell_on_a_jobs_server_walks_the_status_line_and_streams_output(
    shell, cpu_server_url
) -> None:
    result, captured = run(shell, "%%kcoral\nprint('live line')\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert "live line" in captured.stdout
    lines = [o.data.get("text/plain", "") for o in captured.outputs]
    assert any("worker" in line for line in lines), lines
    meta = kcoral_metadata(captured)[-1]
    assert meta["job_id"] and meta["worker_id"]
    # While it runs the line says it is live (JupyterLab rewrites a live line whose kernel
    # restarted), with its job once submitted; its last word is no longer live.
    live = [m for m in kcoral_metadata(captured) if m.get("live")]
    assert live and live[-1]["job_id"] == meta["job_id"] and live[-1]["local_server"] is False
    assert "live" not in meta


def test_noblock_binds_a_job_that_attach_follows_and_binds_outputs(shell, cpu_server_url) -> None:
    result, _ = run(shell, "%%kcoral --noblock -r job -o z\nprint('later')\nz = 7\n")
    assert result.error_in_exec is None, result.error_in_exec
    job = shell.user_ns["job"]
    with capture_output() as captured:
        shell.run_line_magic("kcoral", f"attach {job.id}")
    assert shell.user_ns["z"] == 7
    assert "later" in captured.stdout
    with capture_output() as captured:
        shell.run_line_magic("kcoral", "jobs")
    assert job.id in captured.stdout + "".join(str(o.data) for o in captured.outputs)


def test_cancel_stops_a_noblock_job(shell, cpu_server_url) -> None:
    run(shell, "%%kcoral --noblock -r job\nimport time\ntime.sleep(60)\n")
    job = shell.user_ns["job"]
    with capture_output() as captured:
        shell.run_line_magic("kcoral", f"cancel {job.id}")
    assert "cancelled" in captured.stdout
    job.wait(30)
    assert job.status()["status"] == "CANCELLED"


def test_a_cell_with_pickled_inputs_streams_its_output_live_through_a_job(shell) -> None:
    shell.user_ns["obj"] = {3, 1, 2}
    result, captured = run(shell, "%%kcoral -i obj\nprint('pickled live', sorted(obj))\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert "pickled live [1, 2, 3]" in captured.stdout
    lines = [o.data.get("text/plain", "") for o in captured.outputs]
    assert not any("output comes at the end" in line for line in lines), lines
    assert any("worker" in line for line in lines), lines
    assert kcoral_metadata(captured)[-1]["job_id"]


def test_noblock_works_with_pickled_inputs_and_attach_binds_the_outputs(shell) -> None:
    shell.user_ns["obj"] = {3, 1, 2}
    result, _ = run(shell, "%%kcoral --noblock -r job -i obj -o z\nz = frozenset(obj)\n")
    assert result.error_in_exec is None, result.error_in_exec
    job = shell.user_ns["job"]
    with capture_output():
        shell.run_line_magic("kcoral", f"attach {job.id}")
    assert shell.user_ns["z"] == frozenset({1, 2, 3})
