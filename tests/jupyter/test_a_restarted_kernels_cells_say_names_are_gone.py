"""After a kernel restart ended its session, a cell that uses a name the session held says
why it is gone. A real kernel (jupyter_client) restarted as Jupyter's Restart does, and an
in-process shell against a server without sessions, against real CPU servers."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from jupyter_client.manager import start_new_kernel
from kcoral_jupyter.runner import RemoteCellError
from kcoral_shell import kcoral_shell

pytestmark = pytest.mark.timeout(300)

# One short line, true also where no session ever was (before: three lines that spoke of
# "the kernel's session" and a restart on a kernel that had never had one).
HINT = "hint: cells without a session keep no names; %kcoral session start keeps them"


def shown(kernel, source: str) -> str:
    """What a cell shows: its streams and its error's traceback lines."""
    texts: list[str] = []

    def keep(message: dict) -> None:
        content = message["content"]
        if message["msg_type"] == "stream":
            texts.append(content["text"])
        elif message["msg_type"] == "error":
            texts.extend(content["traceback"])

    kernel.execute_interactive(source, output_hook=keep, timeout=120)
    return "\n".join(texts)


@pytest.mark.slow
def test_a_cell_after_a_kernel_restart_says_the_sessions_names_are_not_kept(
    server_factory, monkeypatch
) -> None:
    # Before: only "NameError: name 'model' is not defined", as if no cell had defined it.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    monkeypatch.setenv("KCORAL_URL", server.url)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    manager, kernel = start_new_kernel(kernel_name="python3")
    manager.shutdown_wait_time = 60.0
    try:
        shown(kernel, "%load_ext kcoral\n%kcoral session start")
        shown(kernel, "%%kcoral\nmodel = 'trained'\n")
        manager.restart_kernel(now=False)  # as Jupyter's Restart
        kernel.wait_for_ready(timeout=60)
        shown(kernel, "%load_ext kcoral")
        text = shown(kernel, "%%kcoral\nmodel\n")
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)
    assert "NameError: name 'model' is not defined" in text, text
    assert HINT in text, text


def test_a_server_without_sessions_gets_no_session_hint(server_factory, monkeypatch) -> None:
    server = server_factory("--num-workers", "1", "--max-sessions", "0")
    with kcoral_shell(server.url, monkeypatch, ()) as ip, capture_output():
        error = ip.run_cell("%%kcoral\nmodel\n").error_in_exec
    assert isinstance(error, RemoteCellError) and error.hint == "", error


def test_a_stateless_cell_using_an_earlier_cells_name_gets_one_short_true_hint(
    server_factory, monkeypatch
) -> None:
    # A kernel that never had a session: before, the hint spoke of "the kernel's session"
    # and a restart, in three lines.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    with kcoral_shell(server.url, monkeypatch, ()) as ip, capture_output():
        assert ip.run_cell("%%kcoral\nweights = 5\n").error_in_exec is None
        error = ip.run_cell("%%kcoral\nweights * 2\n").error_in_exec
    assert isinstance(error, RemoteCellError), error
    assert error.hint == HINT, error.hint
    assert "\n" not in error.hint and len(error.hint) <= 100


def test_a_name_the_cell_binds_only_in_its_own_loop_gets_no_session_hint(
    server_factory, monkeypatch
) -> None:
    # The NameError is the cell's own scoping (item is a comprehension's), not a name an
    # earlier cell defined: before, the hint sent the user to sessions.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    cell = "%%kcoral\nrows = [[item for item in range(3)] for row in range(2)]\ntotal = item\n"
    rebound = "%%kcoral\nweights = weights + 1\n"  # a top-level binding: still the hint
    with kcoral_shell(server.url, monkeypatch, ()) as ip, capture_output():
        scoped = ip.run_cell(cell).error_in_exec
        earlier = ip.run_cell(rebound).error_in_exec
    assert isinstance(scoped, RemoteCellError) and scoped.hint == "", scoped.hint
    assert isinstance(earlier, RemoteCellError) and earlier.hint == HINT, earlier.hint
