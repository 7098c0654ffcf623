"""A cell that runs past its ``--timeout`` says ``TIMED_OUT`` on its status line and in its
output's metadata, as its job's status does (EXTENSIONS §5), not ``ERROR``, which a cell
the server refused or a broken connection also says (notebook soak). A terminal prints the
error only, as for ``ERROR``: the line would repeat its words."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import CellTimeoutError

pytestmark = pytest.mark.timeout(120)
SLOW = "import time\ntime.sleep(30)\n"


def test_a_cell_past_its_timeout_says_timed_out(shell) -> None:
    with capture_output() as seen, pytest.raises(CellTimeoutError) as timed_out:
        shell.run_cell_magic("kcoral", "--timeout 1", SLOW)
    last = seen.outputs[-1]
    assert last.data["text/plain"] == f"kcoral: TIMED_OUT · {timed_out.value.cause}"
    assert last.metadata["kcoral"]["status"] == "TIMED_OUT"


def test_a_terminal_prints_a_timed_out_cells_error_once(
    shell, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CellTimeoutError):
        shell.run_cell_magic("kcoral", "--timeout 1", SLOW)
    said = capsys.readouterr().out
    assert "TIMED_OUT ·" not in said and "ERROR ·" not in said, said
