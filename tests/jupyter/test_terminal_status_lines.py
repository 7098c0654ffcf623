"""A ``%%kcoral`` status line in a terminal IPython (the Jupyter tests' shell, whose display
publisher prints every display and every update as a new line) and in a front end that
updates a display in place (a capture, as a notebook's kernel does), real CPU server.

Before, the terminal printed each update, so one cell printed ``loading the cell`` twice (its
module and its function load) and its status twice (``done (COMPLETED)``, then the summary
``COMPLETED · …``); a notebook replaces each line in place and keeps doing so. A refusal's
line (``ERROR · …``) is not printed on a terminal: the error printed next says the same."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import ServerRefusedError

CELL = "print('from the cell')\n1 + 1\n"


def test_a_terminal_prints_each_status_line_once(shell, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert shell.run_cell_magic("kcoral", "", CELL) == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kcoral:")]
    assert len(lines) == len(set(lines)), lines
    assert "kcoral: loading the cell" in lines
    assert not any(line.startswith("kcoral: done (") for line in lines), lines
    assert lines[-1].startswith("kcoral: COMPLETED · ")


def test_a_front_end_that_updates_in_place_still_gets_every_phase(shell) -> None:
    with capture_output() as seen:
        assert shell.run_cell_magic("kcoral", "", CELL) == 2
    texts = [output.data["text/plain"] for output in seen.outputs]
    assert all(output.update for output in seen.outputs[1:])
    assert "kcoral: done (COMPLETED)" in texts
    assert texts[-1].startswith("kcoral: COMPLETED · ")


def test_a_terminal_says_a_refused_cells_error_once(
    shell, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "kcoral: ERROR · URL answered HTTP 503 no_matching_node: ..." and then the
    # error, "ServerRefusedError: URL answered HTTP 503 no_matching_node: ...", the same words.
    capsys.readouterr()
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_cell_magic("kcoral", "--select gpu=h100", CELL)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("kcoral:")]
    assert not any(refused.value.cause in line for line in lines), lines
