"""A ``%%kcoral`` cell and a remote function called in a cell show stdout and stderr in the
order the program wrote them (EXTENSIONS §16): a notebook's stream outputs alternate as the
program's prints, warnings and logging did. Before, the server answered the two streams
apart and the cell showed ``a``, ``b``, ``c`` and then ``warn`` and the warning.

A real kernel (nbclient) against the real CPU server of the session (jobs: the cell follows
its job's events, whose last output leaves in the program's order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from notebook_cells import connected_cells, executed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROGRAM = """
import logging, sys, warnings
print("a")
print("warn", file=sys.stderr)
print("b")
warnings.warn("careful")
print("c")
logging.getLogger("order").error("logged")
print("d")
"""

REMOTE = """
import kcoral

@kcoral.Client({url!r}).function()
def interleaved():
    import sys
    print("a")
    print("warn", file=sys.stderr)
    print("b")
    return 1

interleaved.remote()
"""


def streams(cell: Any) -> list[tuple[str, str]]:
    """The cell's stream outputs, neighbours of one stream joined (as a notebook shows)."""
    joined: list[tuple[str, str]] = []
    for output in cell.outputs:
        if output.output_type != "stream":
            continue
        if joined and joined[-1][0] == output.name:
            joined[-1] = (output.name, joined[-1][1] + output.text)
        else:
            joined.append((output.name, output.text))
    return joined


def test_a_cell_and_a_remote_function_show_output_in_the_order_written(
    cpu_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = connected_cells(
        cpu_server_url, monkeypatch, "%%kcoral" + PROGRAM, REMOTE.format(url=cpu_server_url)
    )
    notebook = executed(sources, tmp_path)
    cell = streams(notebook.cells[2])
    assert [name for name, _ in cell] == [
        "stdout",
        "stderr",
        "stdout",
        "stderr",
        "stdout",
        "stderr",
        "stdout",
    ], cell
    assert [text for name, text in cell if name == "stdout"] == ["a\n", "b\n", "c\n", "d\n"]
    assert cell[1][1] == "warn\n" and "careful" in cell[3][1] and "logged" in cell[5][1]

    remote = streams(notebook.cells[3])
    assert remote == [("stdout", "a\n"), ("stderr", "warn\n"), ("stdout", "b\n")], remote


LONG_CELL = """
import sys, time
for turn in range(2):
    print("out", turn)
    print("err", turn, file=sys.stderr)
    print("out", turn, "again")
    time.sleep(0.5)  # the job's polls send what came meanwhile, the cell runs on
"""


def test_a_long_cell_shows_its_output_in_the_order_written_while_it_runs(
    cpu_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one call writes both streams within one poll, then sleeps: the live display showed
    # "out 0", "out 0 again", then "err 0", and kept it so
    sources = connected_cells(cpu_server_url, monkeypatch, "%%kcoral" + LONG_CELL)
    assert streams(executed(sources, tmp_path).cells[2]) == [
        ("stdout", "out 0\n"),
        ("stderr", "err 0\n"),
        ("stdout", "out 0 again\nout 1\n"),
        ("stderr", "err 1\n"),
        ("stdout", "out 1 again\n"),
    ]
