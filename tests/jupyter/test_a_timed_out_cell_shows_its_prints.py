"""A ``%%kcoral`` cell and a remote function called in a cell that run past their deadline
show what they printed before it, then the timeout (EXTENSIONS §15). Without live output
(no jobs API: ``KCoral.use_jobs = False``, or a server without one) the 504 carried nothing
and the cell showed only the timeout, however far the program had got.

A real kernel (nbclient) against the real CPU server of the session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from notebook_cells import connected_cells, executed, shown

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CELL = """%%kcoral --timeout 2
import sys, time
print("step 1 done", flush=True)
print("step 2 started", file=sys.stderr, flush=True)
time.sleep(60)
"""

REMOTE = """
import kcoral

@kcoral.Client({url!r}).function(timeout=2)
def hangs():
    import time
    print("remote step 1", flush=True)
    time.sleep(60)

hangs.remote()
"""


@pytest.mark.parametrize("use_jobs", [False, True], ids=["whole-answer", "live-output"])
def test_a_timed_out_cell_shows_its_prints_then_the_timeout(
    cpu_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_jobs: bool
) -> None:
    sources = connected_cells(
        cpu_server_url,
        monkeypatch,
        f"%config KCoral.use_jobs = {use_jobs}",
        CELL,
        REMOTE.format(url=cpu_server_url),
    )
    notebook = executed(sources, tmp_path)
    cell = notebook.cells[3]
    streams = [(o.name, o.text) for o in cell.outputs if o.output_type == "stream"]
    assert ("stdout", "step 1 done\n") in streams and ("stderr", "step 2 started\n") in streams
    # the prints, then the error (the status line above them is updated in place)
    assert cell.outputs[-1].output_type == "error", shown(cell)
    assert "ran past its execution deadline" in cell.outputs[-1].evalue

    remote = notebook.cells[4]
    assert [o.text for o in remote.outputs if o.output_type == "stream"] == ["remote step 1\n"]
    assert remote.outputs[-1].output_type == "error"
    assert "deadline of 2 s" in remote.outputs[-1].evalue


CUT_CELL = """%%kcoral --timeout 2 --output-limit 100
import time
print("x" * 1000, flush=True)
time.sleep(60)
"""


def test_a_timed_out_cell_whose_prints_the_server_cut_says_so_as_a_finished_one_does(
    cpu_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = connected_cells(
        cpu_server_url,
        monkeypatch,
        "%config KCoral.use_jobs = False",  # the 504 carries the prints
        CUT_CELL,
    )
    cell = executed(sources, tmp_path).cells[3]
    stderr = "".join(
        o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"
    )
    assert (
        "[kcoral: stdout was truncated at the output limit (100 bytes per stream); raise it "
        "with --output-limit BYTES"
    ) in stderr, shown(cell)
    assert cell.outputs[-1].output_type == "error", shown(cell)
    assert "ran past its execution deadline" in cell.outputs[-1].evalue
