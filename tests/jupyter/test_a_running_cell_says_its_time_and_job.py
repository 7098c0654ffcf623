"""A ``%%kcoral`` cell's live status line says how long its job has run (queue wait not
counted) and which job it is: ``kcoral: running 2 min 10 s · job 3f9c1a2b``. Before, it said
``kcoral: running`` for as long as the cell ran, so a user could not tell a stuck job from a
long one, nor which job to cancel in the panel. A notebook's line ticks in place (a real CPU
server, a cell that sleeps); a terminal IPython, which prints each update as a new line,
prints the running line once where it cannot rewrite it (a capture, or the cell's output
came after it), and rewrites its last line on a real terminal (a pseudo-terminal)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter import job_clock
from kcoral_jupyter.job_clock import JobClock, said_time
from kcoral_jupyter.magics.status_line import REWRITE_LAST_LINE
from server_process import start_server
from test_terminal_ipython_escapes import ipython_on_a_terminal

SLEEPS = "import time\ntime.sleep(2.5)\n"
JOB = "3f9c1a2b-0000-4000-8000-000000000000"


def test_said_times_tick_each_second_then_each_10_s_then_each_minute() -> None:
    assert said_time(0.4) == ""  # never "0 s", which a terminal would keep
    assert said_time(14.9) == "14 s"
    assert said_time(134.0) == "2 min 10 s"  # floored to its 10 s tick: true when said
    assert said_time(779.0) == "12 min"
    assert said_time(3725.0) == "62 min"  # the panel's way: no hours


def test_the_running_time_counts_from_the_worker_not_the_submission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(job_clock.time, "monotonic", lambda: now[0])
    clock = JobClock(JOB, submitted=1000.0)
    now[0] = 1005.0
    assert clock.phase({"phase": "queued", "position": 2}, "queued behind 2") == (
        "queued behind 2 · 5 s · job 3f9c1a2b"
    )
    now[0] = 1100.0  # 100 s in the queue
    assert clock.phase({"phase": "assigned", "worker_id": "w"}, "worker w") == "worker w"
    now[0] = 1101.0
    cell = {"phase": "instruction", "op": "run", "id": "cell"}
    assert clock.phase(cell, "running") == "running 1 s · job 3f9c1a2b"
    now[0] = 1234.0
    assert clock.line() == "running 2 min 10 s · job 3f9c1a2b"
    assert clock.seconds_to_tick() == pytest.approx(6.01)  # at 2 min 20 s, not each second


def test_a_notebooks_running_line_ticks_in_place_with_its_job(shell) -> None:
    with capture_output() as seen:
        shell.run_cell_magic("kcoral", "", SLEEPS)
    outputs = seen.outputs
    assert all(output.update for output in outputs[1:])  # one line, replaced
    # each message changes the line: "loading the cell" (module, then function) was sent twice
    said = [(output.data, output.metadata) for output in outputs]
    assert all(a != b for a, b in itertools.pairwise(said)), said
    job_id = outputs[-1].metadata["kcoral"]["job_id"]
    texts = [output.data["text/plain"] for output in outputs]
    running = [t for t in texts if t.startswith("kcoral: running ") and "GPU" not in t]
    ticked = [t for t in running if re.fullmatch(r"kcoral: running [12] s · job \S+", t)]
    assert ticked, texts
    assert all(t.endswith(f" · job {job_id[:8]}") for t in running), running
    assert texts[-1].startswith("kcoral: COMPLETED · ")  # the final line as it was


def test_a_terminal_prints_the_running_line_once(shell, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    shell.run_cell_magic("kcoral", "", SLEEPS)
    lines = capsys.readouterr().out.splitlines()
    running = [line for line in lines if line.startswith("kcoral: running")]
    assert len(running) == 1 and re.fullmatch(r"kcoral: running · job \S{8}", running[0]), lines


@pytest.mark.slow
def test_a_terminal_rewrites_its_running_line_until_the_cell_prints(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        cell = SLEEPS + "print('woke')\ntime.sleep(2.5)\n"
        written = ipython_on_a_terminal(server.url, cell.replace("\n", "\\n"))
        seen = written.decode("utf-8", "replace")
    finally:
        server.stop()
    assert "kcoral: COMPLETED" in seen, repr(seen)
    before, after = seen.split("woke", 1)
    rewritten = re.escape(REWRITE_LAST_LINE) + r"kcoral: running \d+ s · job \S{8}\r\n"
    assert re.search(rewritten, before), repr(seen)
    # below the cell's output nothing is rewritten: that would erase the output's last line
    assert REWRITE_LAST_LINE not in after, repr(seen)
