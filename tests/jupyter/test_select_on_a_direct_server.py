"""``--select`` on a direct server (not a router): the server is the node the selector is
matched against, so its facts still decide ``--gpus`` and ``--require-gpu`` before anything
is sent. Before, any ``--select`` turned the prechecks off (they are for a router, whose facts
describe its default kind): ``--gpus 2 --select gpu=cpu`` on a CPU server ended in its 400
``gpu_count exceeds this GPU server's configured capacity`` with the hint 'the server could
not read the request', ``--require-gpu --select gpu=cpu`` ran on the CPU, and ``%kcoral
session start --gpus 2 --select gpu=cpu`` was refused 'gpu_count needs a GPU server'. The
real CPU server of the Jupyter tests."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import GpuRequiredError


def test_more_gpus_than_a_direct_cpu_server_has_are_refused_before_sending(
    shell, cpu_server_url
) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", "--gpus 2 --select gpu=cpu", "x = 1\n")
    assert str(refused.value) == (
        f"%%kcoral: --gpus 2 needs a server with at least 2 GPUs; {cpu_server_url} has 0 (CPU)"
    )


def test_require_gpu_with_a_selector_is_refused_on_a_direct_cpu_server(shell) -> None:
    with pytest.raises(GpuRequiredError):
        shell.run_cell_magic("kcoral", "--require-gpu --select gpu=cpu", "x = 1\n")


def test_an_explicit_gpu_with_a_selector_on_a_cpu_server_warns_that_it_ran_on_cpu(
    shell,
) -> None:
    with capture_output() as seen:
        shell.run_cell_magic("kcoral", "--gpus 1 --select gpu=cpu", "x = 1\n")
    line = seen.outputs[-1].data["text/plain"]
    assert "ran on CPU (this server has no GPU)" in line, line


def test_a_session_with_gpus_and_a_selector_on_a_cpu_server_starts_on_cpu_with_a_warning(
    shell,
) -> None:
    with capture_output() as seen:
        shell.run_line_magic("kcoral", "session start --gpus 2 --select gpu=cpu")
        try:
            assert shell.run_cell("%%kcoral\nn = 3\n").error_in_exec is None
        finally:
            shell.run_line_magic("kcoral", "session stop")
    assert "has no GPU: the session runs on CPU" in seen.stderr, seen.stderr
    assert "started on" in seen.stdout, seen.stdout
