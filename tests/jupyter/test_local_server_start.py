"""A start of the embedded server that fails says why in two lines (the arguments, the
timeout, the log file), and takes ``KCoral.local_args`` / ``local_start_timeout`` as they are
at each start: fixing a bad setting is enough, no kernel restart. The server is a real
``kcoral server`` child of this process, started as a kernel starts it (``embedded_shell``).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import LocalServerStartError
from kcoral_jupyter.extension import kernel_state_of

pytestmark = pytest.mark.timeout(300)


def _failed(ip: Any, source: str) -> list[str]:
    """The rendered error of a cell that must fail with ``LocalServerStartError``."""
    with capture_output():
        result = ip.run_cell(source)
    error = result.error_in_exec
    assert isinstance(error, LocalServerStartError), error
    return list(error._render_traceback_())


def test_a_bad_local_args_fails_in_two_lines_and_fixing_the_setting_is_enough(
    embedded_shell, capsys: pytest.CaptureFixture[str]
) -> None:
    good = list(kernel_state_of(embedded_shell).settings.local_args)
    embedded_shell.run_line_magic("config", "KCoral.local_args = ['--no-such-flag']")
    cause, action = _failed(embedded_shell, "%kcoral local start\n")
    assert cause.startswith("LocalServerStartError: the local KCoral server exited (")
    assert "unrecognized arguments: --no-such-flag" in cause
    assert "arguments: --no-such-flag;" in cause
    log = Path(cause.rsplit("log: ", 1)[1])
    assert log.is_file() and "--no-such-flag" in log.read_text()
    assert "KCoral.local_args" in action and "120 s" in action
    # The log of the failed start stays for %kcoral local log until the next start.
    embedded_shell.run_line_magic("kcoral", "local log")
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().out

    # The fixed setting is used by the next start, in the same kernel.
    embedded_shell.run_line_magic("config", f"KCoral.local_args = {good!r}")
    embedded_shell.run_line_magic("kcoral", "local start")
    assert "local server running at http://127.0.0.1:" in capsys.readouterr().out
    assert kernel_state_of(embedded_shell).local.running
    assert not log.exists()  # the failed start's folder went with the next start


def test_a_start_timeout_that_is_not_positive_is_refused_before_anything_starts(
    embedded_shell,
) -> None:
    for value in ("0", "-5.0", "float('nan')"):
        embedded_shell.run_line_magic("config", f"KCoral.local_start_timeout = {value}")
        cause, action = _failed(embedded_shell, "%kcoral local start\n")
        assert "KCoral.local_start_timeout is " in cause
        assert "needs a positive number of seconds" in cause
        assert "%config KCoral.local_start_timeout = 120" in action
    assert kernel_state_of(embedded_shell).local is None


def test_a_start_that_runs_out_of_its_time_names_the_timeout_and_the_log(embedded_shell) -> None:
    # No `kcoral server` is ready a millisecond after it was started.
    embedded_shell.run_line_magic("config", "KCoral.local_start_timeout = 0.001")
    cause, action = _failed(embedded_shell, "%kcoral local start\n")
    assert "did not start within 0.001 s" in cause
    arguments = shlex.join(kernel_state_of(embedded_shell).settings.local_args)
    assert f"arguments: {arguments}; log: " in cause
    assert "KCoral.local_start_timeout, now 0.001 s" in action
    local = kernel_state_of(embedded_shell).local
    assert not local.running and local.url is None


def test_the_first_cell_says_it_starts_the_local_server_before_the_start_takes_its_seconds(
    embedded_shell,
) -> None:
    # The start takes seconds (workers, torch); the line came only once it was done, so the
    # first cell showed nothing meanwhile (lab soak).
    kernel = kernel_state_of(embedded_shell)
    said: list[tuple[str, bool]] = []

    def announce(text: str) -> None:
        said.append((text, kernel.local is not None and kernel.local.running))

    kernel.announce = announce
    with capture_output():
        result = embedded_shell.run_cell("%%kcoral\nx = 1\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert said[0] == (
        "kcoral: no server configured (KCORAL_URL, %kcoral connect URL); starting a local "
        "server for this kernel's lifetime",
        False,
    )
    text, running = said[1]
    assert text.startswith("kcoral: local server running at http://127.0.0.1:") and running
    assert len(said) == 2


def test_a_local_start_asked_for_beside_a_configured_server_gives_no_false_reason(
    embedded_shell,
) -> None:
    # With a server configured, '%kcoral local start' said 'no server configured (KCORAL_URL,
    # %kcoral connect URL); starting a local server': false, and no reason for a start asked for.
    kernel = kernel_state_of(embedded_shell)
    kernel.settings.url = "http://127.0.0.1:9"
    said: list[str] = []
    kernel.announce = said.append
    embedded_shell.run_line_magic("kcoral", "local start")
    assert said[0] == "kcoral: starting a local server for this kernel's lifetime"
    assert said[1].startswith("kcoral: local server running at http://127.0.0.1:")
    assert len(said) == 2
