"""``%%kcoral -o NAME`` where the cell never sets NAME, in the shell of the Jupyter tests
(real CPU server): the failure is one line naming the name and what to do. Before, it came
with a "Remote traceback" of no frame of the user's, only the magic's internal
``kcoral.protocol.errors.ExecutionError`` repeating the message."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.runner import RemoteCellError


def test_an_output_name_the_cell_never_sets_fails_in_one_line(shell) -> None:
    with capture_output(), pytest.raises(RemoteCellError) as failed:
        shell.run_cell_magic("kcoral", "-o missing", "x = 1\n")
    shown = failed.value._render_traceback_()
    assert len(shown) == 1, shown
    assert shown[0].endswith(
        "failed: runtime: --out name 'missing' is not set by the cell: set it there or "
        "leave it out of -o"
    )


def test_a_failure_in_the_cell_keeps_its_remote_traceback(shell) -> None:
    with capture_output(), pytest.raises(RemoteCellError) as failed:
        shell.run_cell_magic("kcoral", "", "def g():\n    raise ValueError('boom')\ng()\n")
    shown = failed.value._render_traceback_()
    assert "Remote traceback:" in shown
    assert "    raise ValueError('boom')" in shown
    assert shown[-1] == "ValueError: boom"
