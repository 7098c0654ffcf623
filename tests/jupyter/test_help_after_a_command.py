"""``--help`` (or ``-h``) after a ``%kcoral`` command shows that command's help, after a
group (``%kcoral session --help``) each of its commands', and on a ``%%kcoral`` line the
cell's options, without running the cell. Before, ``%kcoral jobs --help`` and ``%kcoral
session start --help`` were refused 'unrecognized arguments: --help', ``%kcoral attach
--help`` 'the following arguments are required: JOB_ID', and ``%%kcoral --help`` likewise.
The in-process shell; no server is asked (the URL answers nothing)."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.magics.options import SESSION_EPILOG, cell_parser, line_parsers
from kcoral_shell import kcoral_shell

NOBODY = "http://127.0.0.1:9"  # nothing is sent: help never reaches a server


@pytest.mark.parametrize(
    "command", ["jobs", "attach", "session start", "session attach", "local log", "connect"]
)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_after_a_command_shows_that_commands_help(monkeypatch, command, flag) -> None:
    with kcoral_shell(NOBODY, monkeypatch, ()) as ip, capture_output() as seen:
        result = ip.run_cell(f"%kcoral {command} {flag}")
    assert result.error_in_exec is None, result.error_in_exec
    assert seen.stdout == line_parsers()[command].format_help()


def test_help_after_a_group_shows_each_of_its_commands(monkeypatch) -> None:
    with kcoral_shell(NOBODY, monkeypatch, ()) as ip, capture_output() as seen:
        result = ip.run_cell("%kcoral session --help")
    assert result.error_in_exec is None, result.error_in_exec
    for words in ("start", "stop", "status", "attach", "list"):
        assert line_parsers()[f"session {words}"].usage_line() in seen.stdout
    assert " ".join(SESSION_EPILOG.split()) in " ".join(seen.stdout.split())


def test_help_on_a_cell_line_shows_the_cells_options_and_runs_nothing(monkeypatch) -> None:
    with kcoral_shell(NOBODY, monkeypatch, ("ran",)) as ip, capture_output() as seen:
        result = ip.run_cell("%%kcoral -i x --help\nran = True\n")
    assert result.error_in_exec is None, result.error_in_exec
    assert seen.stdout == cell_parser().format_help()
    assert "ran" not in ip.user_ns
