"""A kernel's session whose server is gone: what the notebook says. In-process shells against
the embedded server (``embedded_shell``, Linux only) and a real CPU server of the test's own."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import SessionEndedError
from kcoral_jupyter.extension import kernel_state_of

pytestmark = pytest.mark.timeout(300)


def run(ip: Any, source: str) -> tuple[Any, Any]:
    with capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def two_lines(result: Any, kind: type[Exception]) -> list[str]:
    error = result.error_in_exec
    assert isinstance(error, kind), error
    lines = list(error._render_traceback_())
    assert len(lines) == 2, lines
    return lines


def test_stopping_the_local_server_says_its_session_ended_and_later_cells_say_so_too(
    embedded_shell,
) -> None:
    # Before: the stop said only "local server stopped", the next cell "no answer from URL
    # ... %kcoral local start gives this kernel its own", and after that start the session
    # cells still went to the dead address with the same advice.
    run(embedded_shell, "%kcoral session start")
    label = kernel_state_of(embedded_shell).sessions.current.label
    run(embedded_shell, "%%kcoral\nx = 1\n")
    _, stopped = run(embedded_shell, "%kcoral local stop")
    assert stopped.stdout.splitlines()[-1] == (
        f"kcoral: local server stopped; {label} ended with it (its state is gone)"
    )
    run(embedded_shell, "%kcoral local start")
    for source in ("%%kcoral\nx\n", "%kcoral session status"):
        lines = two_lines(run(embedded_shell, source)[0], SessionEndedError)
        assert lines[0].endswith(
            "has ended: this kernel's local server stopped, and its sessions ended with it"
        ), lines
        assert "%kcoral session start begins a new session" in lines[1]
    run(embedded_shell, "%kcoral session stop")
    result, _ = run(embedded_shell, "%%kcoral\n2\n")  # on the new local server, no session
    assert result.error_in_exec is None and result.result == 2


def test_a_session_on_a_local_server_that_exited_is_said_to_have_ended_with_it(
    embedded_shell,
) -> None:
    run(embedded_shell, "%kcoral session start")
    local = kernel_state_of(embedded_shell).local
    assert local is not None and local.process is not None
    local.process.kill()  # it died (out of memory, say): the kernel did not stop it
    local.process.wait(10)
    lines = two_lines(run(embedded_shell, "%%kcoral\n1\n")[0], SessionEndedError)
    assert "this kernel's local server stopped, and its sessions ended with it" in lines[0]
