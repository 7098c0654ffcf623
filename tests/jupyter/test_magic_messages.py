"""What the magics say (issue 20): two-line errors, nothing silent, limits that say how to move
them, predictable types, the small things. An in-process IPython shell against a real CPU
server (the ``shell`` fixture of ``conftest.py``)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import (
    CellCancelledError,
    EmbeddedServerUnavailableError,
    GpuRequiredError,
    NotConnectedError,
    ServerUnreachableError,
    refused,
)
from kcoral_jupyter.extension import kernel_state_of
from kcoral_jupyter.magics.options import join_name_lists
from kcoral_jupyter.runner import RemoteCellError
from stand_in_http import StandIn, serving

from kcoral import Client, KCoralError

pytestmark = pytest.mark.timeout(300)

DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens there


def run(ip: Any, source: str) -> tuple[Any, Any]:
    with capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def rendered(error: Any) -> list[str]:
    return list(error._render_traceback_())


def lines_of(captured: Any) -> list[str]:
    return [o.data.get("text/plain", "") for o in captured.outputs]


# ------------------------------------------------------------------ 2: errors on one screen


def test_a_dead_url_fails_in_one_line_of_cause_and_one_of_what_to_do(shell) -> None:
    result, _ = run(shell, f"%%kcoral --url {DEAD_URL}\n1\n")
    error = result.error_in_exec
    assert isinstance(error, ServerUnreachableError)
    lines = rendered(error)
    assert len(lines) == 2 and len("\n".join(lines)) < 300, lines
    assert lines[0] == f"ServerUnreachableError: no answer from {DEAD_URL}: connection refused"
    # The hint names the address tried (port 9), not a port the user never used.
    assert "(kcoral server --port 9)" in lines[1] and "8123" not in lines[1]


class BadGateway(StandIn):
    """A proxy whose KCoral server is down: 502 with its own HTML page, to everything."""

    def answer(self) -> None:
        page = b"<h1>502 Bad Gateway</h1>"
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    do_GET = do_POST = answer


def test_an_answer_without_a_kcoral_error_says_so_instead_of_repeating_its_status(shell) -> None:
    # Before: "http://... answered HTTP 502: HTTP 502", and the action named a kind.
    with serving(BadGateway) as url:
        result, _ = run(shell, f"%%kcoral --url {url}\n1\n")
    lines = rendered(result.error_in_exec)
    assert lines[0] == f"ServerRefusedError: {url} answered HTTP 502 without a KCoral error", lines
    assert lines[1].endswith(
        "is it a KCoral server (or a proxy in front of one)? "
        "%kcoral status shows what answers there"
    ), lines
    assert len(lines) == 2


def test_verbose_errors_show_the_whole_chain_with_the_internal_frames(shell) -> None:
    shell.run_line_magic("config", "KCoral.verbose_errors = True")
    result, _ = run(shell, f"%%kcoral --url {DEAD_URL}\n1\n")
    text = "\n".join(rendered(result.error_in_exec))
    assert "Traceback (most recent call last)" in text
    assert "urllib3" in text and "magics.py" in text
    assert text.rstrip().endswith("%kcoral local start gives this kernel its own")


def test_an_http_error_says_its_status_and_kind_and_what_to_do(shell) -> None:
    result, _ = run(shell, "%kcoral attach 00000000-0000-4000-8000-000000000000")
    lines = rendered(result.error_in_exec)
    assert len(lines) == 2
    assert "HTTP 404 not_found" in lines[0] and "%kcoral jobs" in lines[1]


def test_an_interrupted_cell_cancels_its_job_and_ends_in_two_lines(shell, cpu_server_url) -> None:
    client = Client(cpu_server_url)
    before = {job["job_id"] for job in client.jobs()}
    main = threading.get_ident()

    def interrupt_once_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = [
                j for j in client.jobs() if j["job_id"] not in before and j["status"] == "RUNNING"
            ]
            if running:
                signal.pthread_kill(main, signal.SIGINT)  # what Jupyter's interrupt does
                return
            time.sleep(0.05)

    thread = threading.Thread(target=interrupt_once_running, daemon=True)
    thread.start()
    result, _ = run(shell, "%%kcoral\nimport time\ntime.sleep(60)\n")
    thread.join()
    error = result.error_in_exec
    assert isinstance(error, CellCancelledError) and isinstance(error, KeyboardInterrupt)
    lines = rendered(error)
    assert len(lines) == 2 and "cancelled" in lines[0], lines
    new = [j for j in client.jobs() if j["job_id"] not in before]
    assert new
    job = client.job(new[0]["job_id"])
    job.wait(30)
    assert job.status()["status"] == "CANCELLED"
    client.close()


@pytest.mark.parametrize("interrupts", [1, 2])
def test_an_interrupt_while_a_cell_is_submitted_says_what_became_of_its_job(
    shell, cpu_server_url, monkeypatch, interrupts
) -> None:
    # Jupyter's interrupt after the server took the job, before its id came back. Before,
    # the job ran on with no id to cancel it by, and the cell said it was cancelled.
    client = Client(cpu_server_url)
    before = {job["job_id"] for job in client.jobs()}
    submit = Client.submit

    def interrupted_submit(self, program, **options):
        job = submit(self, program, **options)
        held = signal.getsignal(signal.SIGINT).__self__  # the cell's HeldInterrupt
        for count in range(1, interrupts + 1):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            # The submission runs in a thread, the handler in the cell's: each interrupt is
            # taken before the next is sent, as a user's are (two at once are one to Python).
            while count < interrupts and not held.noted:
                time.sleep(0.01)
        return job

    monkeypatch.setattr(Client, "submit", interrupted_submit)
    result, _ = run(shell, "%%kcoral\nimport time\ntime.sleep(60)\n")
    monkeypatch.undo()
    error = result.error_in_exec
    assert isinstance(error, CellCancelledError) and isinstance(error, KeyboardInterrupt)
    lines = rendered(error)
    (new,) = [j for j in client.jobs() if j["job_id"] not in before]
    job = client.job(new["job_id"])
    if interrupts == 1:  # held until the job's id was known, then cancelled
        assert "was cancelled" in lines[0], lines
        job.wait(30)
        assert job.status()["status"] == "CANCELLED"
    else:  # the second abandons the submission: the cell says the job may run
        assert "the server may have started it; %kcoral jobs lists your jobs" in lines[0]
        assert job.status()["status"] in ("QUEUED", "RUNNING")
        job.cancel()
    client.close()


def test_a_remote_traceback_stays_whole_and_a_kernel_name_gets_an_i_hint(shell) -> None:
    shell.user_ns["w"] = 5
    result, _ = run(shell, "%%kcoral\ndef f():\n    return w + 1\nf()\n")
    error = result.error_in_exec
    assert isinstance(error, RemoteCellError)
    text = "\n".join(rendered(error))
    assert "return w + 1" in text and "NameError: name 'w' is not defined" in text
    assert text.endswith("send it with -i w")
    result, _ = run(shell, "%%kcoral\nnot_in_the_kernel_either\n")
    assert "-i" not in rendered(result.error_in_exec)[-1]


# ------------------------------------------------------------------ 3: nothing silent


def test_a_failed_connect_leaves_the_kernel_unconnected_and_the_next_cell_says_so(
    shell, cpu_server_url
) -> None:
    result, _ = run(shell, f"%kcoral connect {DEAD_URL}")
    assert isinstance(result.error_in_exec, ServerUnreachableError)
    assert "stays unconnected" in str(result.error_in_exec)
    result, _ = run(shell, "%%kcoral\n1\n")
    error = result.error_in_exec
    assert isinstance(error, NotConnectedError)
    assert rendered(error)[0].startswith(
        f"NotConnectedError: not connected: %kcoral connect {DEAD_URL}"
    )
    kernel = kernel_state_of(shell)
    assert kernel is not None and kernel.local is None  # no embedded server was started
    result, _ = run(shell, f"%kcoral connect {cpu_server_url}")
    assert result.error_in_exec is None
    result, _ = run(shell, "%%kcoral\n6 * 7\n")
    assert result.result == 42


def test_an_explicit_gpus_on_a_cpu_server_says_it_ran_on_cpu_in_warning_style(shell) -> None:
    result, captured = run(shell, "%%kcoral --gpus 1\n1\n")
    assert result.error_in_exec is None, result.error_in_exec
    summary = lines_of(captured)[-1]
    assert "\u26a0" in summary and "ran on CPU (this server has no GPU)" in summary
    html = captured.outputs[-1].data["text/html"]
    assert "#9a6700" in html
    meta = [o.metadata["kcoral"] for o in captured.outputs if (o.metadata or {}).get("kcoral")]
    assert meta[-1]["warning"] == "ran on CPU (this server has no GPU)"
    # Without the option the line stays as it was (every cell defaults to --gpus 1).
    result, captured = run(shell, "%%kcoral\n1\n")
    assert "no GPU" not in lines_of(captured)[-1] and "ran on CPU" in lines_of(captured)[-1]


def test_a_quiet_cell_with_an_explicit_gpus_still_warns_on_stderr(shell) -> None:
    result, captured = run(shell, "%%kcoral --gpus 1 --quiet\n1\n")
    assert result.error_in_exec is None
    assert "warning: ran on CPU (this server has no GPU)" in captured.stderr


def test_require_gpu_makes_a_cpu_run_an_error_before_anything_runs(shell) -> None:
    result, _ = run(shell, "%%kcoral --require-gpu\nprint('ran')\n")
    assert isinstance(result.error_in_exec, GpuRequiredError)
    assert "--require-gpu" in rendered(result.error_in_exec)[0]
    shell.run_line_magic("config", "KCoral.require_gpu = True")
    result, captured = run(shell, "%%kcoral\nprint('ran')\n")
    assert isinstance(result.error_in_exec, GpuRequiredError)
    assert "KCoral.require_gpu" in str(result.error_in_exec) and "ran" not in captured.stdout


# ------------------------------------------------------------------ 4: limits that say how


def test_truncated_output_names_the_limit_and_the_option(shell) -> None:
    result, captured = run(shell, "%%kcoral --output-limit 10\nprint('x' * 100)\n")
    assert result.error_in_exec is None
    assert "stdout was truncated at the output limit (10 bytes per stream)" in captured.stderr
    assert "--output-limit BYTES" in captured.stderr


def test_a_result_over_the_response_limit_names_both_sizes_and_the_server_flag(
    shell, server_factory
) -> None:
    server = server_factory("--log-dir", "", "--num-workers", "1", "--max-response-bytes", "100000")
    # a string: its JSON passes the limit (a tensor's bytes fail its return, below)
    result, _ = run(shell, f"%%kcoral --url {server.url}\n'x' * 200_000\n")
    error = result.error_in_exec
    cause, action = rendered(error)
    assert "HTTP 500 response_too_large" in cause  # the status the protocol fixes
    assert "limit 100000 bytes" in cause and "bytes, limit" in cause
    assert "--max-response-bytes" in cause and "return less" in action
    result, _ = run(shell, f"%%kcoral --url {server.url}\nimport numpy\nnumpy.zeros(100_000)\n")
    shown = "\n".join(rendered(result.error_in_exec))
    assert "a tensor of 800000 bytes, 100000 bytes left" in shown
    assert "--max-response-bytes" in shown


# ------------------------------------------------------------------ 5: predictable types


def test_tensors_come_back_in_the_library_of_the_cells_tensor_inputs(shell) -> None:
    torch = pytest.importorskip("torch", reason="the type rule for torch needs torch")
    shell.user_ns["x"] = np.arange(3, dtype=np.float32)
    made = "import numpy, torch\na = torch.ones(2)\nb = numpy.ones(2)\n"
    result, _ = run(shell, "%%kcoral -i x -o a,b\n" + made)
    assert result.error_in_exec is None, result.error_in_exec
    # NumPy in, NumPy out: x arrived remotely as a torch tensor, but came from NumPy.
    assert isinstance(shell.user_ns["a"], np.ndarray) and isinstance(shell.user_ns["b"], np.ndarray)
    shell.user_ns["t"] = torch.arange(3)
    result, _ = run(shell, "%%kcoral -i t -o a,b\n" + made)
    assert result.error_in_exec is None, result.error_in_exec
    # torch in, torch out, also for what the cell made with NumPy.
    assert isinstance(shell.user_ns["a"], torch.Tensor) and isinstance(
        shell.user_ns["b"], torch.Tensor
    )
    result, _ = run(shell, "%%kcoral -i x,t -o a,b\n" + made)
    # both kinds in: each as its remote type.
    assert isinstance(shell.user_ns["a"], torch.Tensor) and isinstance(
        shell.user_ns["b"], np.ndarray
    )
    result, _ = run(shell, "%%kcoral --torch -i x -o b\n" + made)
    assert isinstance(shell.user_ns["b"], torch.Tensor)  # --torch forces torch
    result, _ = run(shell, "%%kcoral --numpy --torch -o b\n" + made)
    assert isinstance(result.error_in_exec, UsageError)
    result, _ = run(shell, "%%kcoral\nimport torch\ntorch.arange(3)\n")
    assert isinstance(result.result, torch.Tensor)
    result, _ = run(
        shell, "%%kcoral --numpy -o a\nimport torch\na = torch.ones(2)\ntorch.ones(1)\n"
    )
    assert isinstance(shell.user_ns["a"], np.ndarray) and isinstance(result.result, np.ndarray)


def test_the_help_states_the_type_rule() -> None:
    from kcoral_jupyter.magics.options import HELP

    assert "Tensors come back in the library of the cell's -i tensors (NumPy" in HELP
    assert "--numpy / --torch force either" in HELP


# ------------------------------------------------------------------ 6: small things


def test_help_and_version_answer_without_starting_a_server(shell) -> None:
    for command in ("--help", "-h"):
        with capture_output() as captured:
            shell.run_line_magic("kcoral", command)
        assert "%%kcoral [options]" in captured.stdout and "%kcoral version" in captured.stdout
    with capture_output() as captured:
        shell.run_line_magic("kcoral", "version")
    assert captured.stdout.startswith("kcoral ")
    assert "protocol 1" in captured.stdout  # the configured server answered
    assert kernel_state_of(shell).local is None


def test_connect_adds_http_to_a_bare_host_and_port(shell, cpu_server_url) -> None:
    bare = cpu_server_url.removeprefix("http://")
    with capture_output() as captured:
        shell.run_line_magic("kcoral", f"connect {bare}")
    assert f"connected to {cpu_server_url}" in captured.stdout
    result, _ = run(shell, f"%%kcoral --url {bare}\n2 + 2\n")
    assert result.result == 4


def test_a_name_list_may_have_spaces_after_its_commas(shell) -> None:
    shell.user_ns["a"], shell.user_ns["b"] = 2, 3
    result, _ = run(shell, "%%kcoral -i a, b -o x , y\nx = a * b\ny = a + b\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert (shell.user_ns["x"], shell.user_ns["y"]) == (6, 5)
    assert join_name_lists(["-i", "a,", "b", "--file", "p,", "q"]) == [
        "-i",
        "a,b",
        "--file",
        "p,",
        "q",
    ]


def test_jobs_prints_rounded_durations(shell) -> None:
    run(shell, "%%kcoral\n1\n")
    with capture_output() as captured:
        shell.run_line_magic("kcoral", "jobs")
    text = captured.outputs[-1].data["text/plain"]
    for word in text.split():
        if "." in word and word.replace(".", "").isdigit():  # a duration, e.g. 3.0 before "ms"
            assert len(word.split(".")[1]) <= 1, text


@pytest.mark.parametrize("option", ["--gpu 1", "--time 5", "--out-limit 5", "--nob"])
def test_abbreviated_cell_options_are_refused(shell, option) -> None:
    with pytest.raises(UsageError, match="unrecognized arguments"):
        shell.run_cell_magic("kcoral", option, "x = 1\n")


# ------------------------------------------------------------------ 8: not Linux


def test_on_macos_without_a_server_the_first_cell_says_the_embedded_server_needs_linux(
    shell, monkeypatch
) -> None:
    shell.run_line_magic("config", "KCoral.url = ''")
    monkeypatch.setattr(sys, "platform", "darwin")
    result, _ = run(shell, "%%kcoral\n1\n")
    error = result.error_in_exec
    assert isinstance(error, EmbeddedServerUnavailableError)
    cause, action = rendered(error)
    assert "the embedded KCoral server needs Linux (this kernel runs on macOS)" in cause
    assert "%kcoral connect http://HOST:8123" in action
    assert kernel_state_of(shell).local is None


# ------------------------------------------------------------------ the line's own typing


@pytest.mark.parametrize(
    ("line", "cell"),
    [
        ('connect "http://127.0.0.1:1', None),
        ("session start --idle '60", None),
        ("jobs \\", None),
        ('--timeout "5', "print(1)\n"),
    ],
)
def test_an_unclosed_quote_or_a_trailing_backslash_is_a_one_line_usage_error(
    shell, line, cell
) -> None:
    source = f"%kcoral {line}" if cell is None else f"%%kcoral {line}\n{cell}"
    result, _ = run(shell, source)
    error = result.error_in_exec
    assert isinstance(error, UsageError), error
    magic = "%kcoral" if cell is None else "%%kcoral"
    assert str(error).startswith(f"{magic}: ") and "\n" not in str(error)
    assert repr(line) in str(error) and "(close it, or leave it out)" in str(error)
    assert kernel_state_of(shell).failed_connect is None  # nothing was tried


def test_a_busy_answer_tells_a_wait_from_a_server_that_needs_its_operator() -> None:
    def action(message: str) -> str:
        error = refused(KCoralError(503, message, kind="busy"), "gpu-box")
        return rendered(error)[1]

    waited = "server saturated: no worker became free within --worker-wait-timeout-seconds"
    assert "run the cell again in a moment" in action(waited)
    assert "once the server is back" in action("server saturated: the server is shutting down")
    stuck = (
        "server saturated: it admits no program since a worker's end could not be confirmed "
        "(its log says which); its operator must restart it"
    )
    assert "ask the server's operator to restart it" in action(stuck)
    assert "again in a moment" not in action(stuck)
