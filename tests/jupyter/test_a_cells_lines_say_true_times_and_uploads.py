"""What a ``%%kcoral`` cell's status line says over time, in a real kernel (nbclient) on the
real CPU server of the Jupyter tests, every update of the line as the user saw it:

* a finished cell says its durations as the KCoral panel writes them (``total 5.3 s``, not
  ``total 5346 ms`` beside the panel's ``5.3 s``);
* ``%kcoral attach`` says the job's true running time, from the job's own start (its events
  replay at once: the line said ``running`` with no time);
* a large upload's progress is said on the line, in place, then the running line (or a
  ``--noblock`` cell's submitted job) replaces it (the client drew it only on a terminal's
  stderr, so a notebook said nothing for the seconds a 100 MiB input took); a small upload
  says nothing of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kcoral_jupyter.display import format_ms
from kcoral_jupyter.runner import describe_instruction
from notebook_cells import connected_cells, executed_with_lines, shown

pytestmark = pytest.mark.timeout(300)


def test_durations_are_written_as_the_panel_writes_them() -> None:
    # the cases of formatDuration's test (labextension/src/__tests__/jobtable.test.ts)
    assert format_ms(None) == "–"
    assert format_ms(0.011) == "0 ms"
    assert format_ms(3456) == "3.5 s"
    assert format_ms(125000) == "2 min 5 s"
    assert format_ms(5346) == "5.3 s"  # the cell said "5346 ms" where the panel said "5.3 s"
    assert format_ms(12.5) == "13 ms"  # JavaScript's Math.round: a half goes up


def test_a_folders_instruction_says_what_it_does() -> None:
    # the worker writes the files the submission brought; the line said
    # "instruction 0: uploading upload_0" after the upload had ended
    data = {"op": "upload", "id": "upload_0", "index": 0}
    assert describe_instruction("upload", "upload_0", data) == "writing the sent files"


def test_a_notebooks_lines_say_true_times_and_a_large_uploads_progress(
    cpu_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = connected_cells(
        cpu_server_url,
        monkeypatch,
        "%%kcoral\nimport time\ntime.sleep(1.2)\n",  # 2
        "%%kcoral --noblock -r job\nimport time\ntime.sleep(4)\n",  # 3
        # 4: the job has run 2 s when it is attached
        "import time\n"
        "while job.status()['status'] != 'RUNNING':\n"
        "    time.sleep(0.05)\n"
        "time.sleep(2)\n",
        "%kcoral attach {job.id}",  # 5
        # 6: every count said (a loopback upload is over before the first redraw's time)
        "import kcoral_jupyter.submission\n"
        "kcoral_jupyter.submission.UPLOAD_REDRAW_SECONDS = 0\n"
        "big = bytes(100 << 20)\nsmall = bytes(1000)\nother = b'1' * (100 << 20)",
        "%%kcoral -i big\nlen(big)\n",  # 7
        "%%kcoral -i small\nlen(small)\n",  # 8
        # 9: not big, whose bytes the server keeps now: only what it lacks is sent
        "%%kcoral --noblock -r other_job -i other\nlen(other)\n",
        "other_job.result().status",  # 10
    )
    notebook, said = executed_with_lines(sources, tmp_path, timeout=240)
    for index, cell in enumerate(notebook.cells):
        print(f"--- cell {index}: {cell.source!r}\n    lines: {said.get(index, [])}")
        print("    shown: " + shown(cell).replace("\n", "\n           "))
    cells = notebook.cells

    finished = said[2][-1]
    assert re.search(r" · total \d+\.\d s", finished), said[2]  # 1.2 s and more: "1.3 s"

    running = [line for line in said[5] if line.startswith("kcoral: running")]
    assert running, said[5]
    seconds = re.fullmatch(r"kcoral: running (\d+) s · job \S{8}", running[0])
    assert seconds and int(seconds.group(1)) >= 2, running  # its start, not the attach's
    assert "COMPLETED" in said[5][-1], said[5]
    # its replayed queue wait is past: not counted up to the attach (it said "· 2 s")
    assert "kcoral: waiting for a worker" in said[5], said[5]

    uploading = [line for line in said[7] if line.startswith("kcoral: upload")]
    assert uploading and uploading[-1] == "kcoral: uploaded 100.0 MiB", said[7]
    progress = r"kcoral: uploading \d+(\.\d)? (B|KiB|MiB) of 100\.0 MiB"
    assert len(uploading) > 50 and all(re.fullmatch(progress, u) for u in uploading[:-1])
    assert said[7].index(uploading[-1]) < said[7].index("kcoral: submitted"), said[7]
    assert "104857600" in shown(cells[7]), shown(cells[7])
    shown_lines = [o for o in cells[7].outputs if o.output_type == "display_data"]
    assert len(shown_lines) == 1, shown_lines  # the status line, updated in place
    assert not [line for line in said[8] if "upload" in line], said[8]

    # a --noblock cell's line says its upload, then where its job went, in place
    assert said[9][-2] == "kcoral: uploaded 100.0 MiB", said[9]
    assert said[9][-1].startswith("kcoral: submitted job "), said[9]
    shown_lines = [o for o in cells[9].outputs if o.output_type == "display_data"]
    assert len(shown_lines) == 1 and not shown_lines[0].metadata["kcoral"].get("live"), shown_lines
    assert "COMPLETED" in shown(cells[10]), shown(cells[10])
