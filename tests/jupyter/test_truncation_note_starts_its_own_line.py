"""The note a ``%%kcoral`` cell prints when the output limit cut its output starts on a line
of its own, real CPU server.

Before, in a terminal IPython (stdout and stderr on one screen) a cut stream that ended
without a newline took the note at the end of its last line:
``xxxxxxxxxx[kcoral: stdout was truncated at the output limit ...]``. A notebook keeps stdout
and stderr apart, so there only a cut stderr joined the note; and a note that needs no new
line gets no blank line before it."""

from __future__ import annotations

import io
import sys

import pytest
from IPython.utils.capture import capture_output

CUT_STDOUT = "print('x' * 30, end='')\n"
CUT_STDERR = "import sys\nsys.stderr.write('y' * 30)\n"


def one_screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """stdout and stderr written to one text, as a terminal shows them."""
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    return screen


def test_in_a_terminal_the_note_after_an_unfinished_line_starts_a_new_line(
    shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = one_screen(monkeypatch)
    shell.run_cell_magic("kcoral", "--output-limit 10", CUT_STDOUT)
    lines = screen.getvalue().splitlines()
    assert "xxxxxxxxxx" in lines, lines
    assert any(
        line.startswith("[kcoral: stdout was truncated at the output limit") for line in lines
    )


def test_in_a_notebook_a_cut_stderr_is_followed_by_the_note_on_its_own_line(shell) -> None:
    with capture_output() as seen:
        shell.run_cell_magic("kcoral", "--output-limit 10", CUT_STDERR)
    assert "yyyyyyyyyy\n[kcoral: stderr was truncated at the output limit" in seen.stderr


def test_in_a_notebook_a_note_after_cut_stdout_has_no_blank_line_before_it(shell) -> None:
    with capture_output() as seen:
        shell.run_cell_magic("kcoral", "--output-limit 10", CUT_STDOUT)
    assert seen.stdout == "xxxxxxxxxx"
    assert seen.stderr.startswith("[kcoral: stdout was truncated at the output limit")


def test_both_streams_cut_get_one_note(shell) -> None:
    # Before: two notes of ~200 characters, one per stream, that said the same.
    with capture_output() as seen:
        shell.run_cell_magic("kcoral", "--output-limit 10", CUT_STDOUT + CUT_STDERR)
    notes = [line for line in seen.stderr.splitlines() if line.startswith("[kcoral: ")]
    assert len(notes) == 1, notes
    assert notes[0].startswith(
        "[kcoral: stdout and stderr were truncated at the output limit (10 bytes per stream)"
    )
