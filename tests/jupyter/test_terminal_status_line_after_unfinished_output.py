"""In a terminal IPython (stdout and stderr on one screen, each status line printed as a
line), a status line that follows a cell's output which ended without a newline starts on a
line of its own, real CPU server.

Before, the summary took the end of the output's last line:
``no newlinekcoral: COMPLETED · http://... · ran on CPU · ...``. A notebook keeps its status
line in a display of its own and its output unchanged."""

from __future__ import annotations

import io
import sys

import pytest
from IPython.utils.capture import capture_output

UNFINISHED = "print('no newline', end='')\n"


def test_in_a_terminal_the_summary_after_an_unfinished_line_starts_a_new_line(
    shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    shell.run_cell_magic("kcoral", "", UNFINISHED)
    lines = screen.getvalue().splitlines()
    assert "no newline" in lines, lines
    assert lines[-1].startswith("kcoral: COMPLETED · "), lines


def test_in_a_notebook_the_output_is_kept_as_the_cell_wrote_it(shell) -> None:
    with capture_output() as seen:
        shell.run_cell_magic("kcoral", "", UNFINISHED)
    assert seen.stdout == "no newline"
