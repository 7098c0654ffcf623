"""``%kcoral session stop`` of a session that had already ended (its idle timeout, another
client's stop, the kernel's local server gone) says the kernel left it, not that it ended
it: before, 'kcoral: session 3f2a1b2c ended on URL (its state is gone)', as if the stop had
ended it. The real CPU server of the Jupyter tests."""

from __future__ import annotations

from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import SessionEndedError
from kcoral_jupyter.extension import kernel_state_of

from kcoral import Client


def test_stopping_a_session_that_had_ended_says_the_kernel_left_it(shell, cpu_server_url) -> None:
    with capture_output():
        shell.run_line_magic("kcoral", "session start")
    remote = kernel_state_of(shell).sessions.current
    try:
        with Client(cpu_server_url) as client:
            client.attach_session(remote.id).close()  # as another kernel's stop would
        with capture_output():
            ended = shell.run_cell("%%kcoral\n1\n").error_in_exec
        assert isinstance(ended, SessionEndedError), ended
    finally:
        with capture_output() as seen:
            shell.run_line_magic("kcoral", "session stop")
    assert seen.stdout == (
        f"kcoral: left {remote.label}, which had already ended; cells run without a session again\n"
    )
