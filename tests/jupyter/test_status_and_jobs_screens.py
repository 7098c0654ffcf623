"""What a cell's status line and ``%kcoral jobs`` show (issue 29 points 5 and 11): only what
is true, in words a user reads. An in-process shell against a real CPU server."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.utils.capture import capture_output

pytestmark = pytest.mark.timeout(300)


def shown(ip: Any, source: str) -> list[dict[str, str]]:
    """Every display the cell (or line magic) published, status-line updates included."""
    with capture_output() as captured:
        result = ip.run_cell(source)
    assert result.error_in_exec is None, result.error_in_exec
    return [dict(output.data) for output in captured.outputs]


def test_a_cpu_cells_status_line_names_no_gpu_lease_and_says_its_status_once(shell) -> None:
    outputs = shown(shell, "%%kcoral\nprint('hi')\n1\n")
    final = outputs[-1]
    plain, html = final["text/plain"], final["text/html"]
    assert "ran on CPU" in plain
    assert "lease wait" not in plain and "held" not in plain  # a CPU server has no lease
    assert plain.startswith("kcoral: COMPLETED · ") and plain.count("COMPLETED") == 1
    # In HTML the badge says it; the text after it does not say it again.
    assert html.count("COMPLETED") == 1 and 'class="kcoral-status"' in html


def test_a_running_cell_says_what_it_does_in_the_cells_words(shell) -> None:
    shell.user_ns["n"] = b"abc"
    lines = [o["text/plain"] for o in shown(shell, "%%kcoral -i n\nlen(n)\n")]
    assert "kcoral: running" in lines and "kcoral: sending n" in lines
    assert not [line for line in lines if "instruction" in line or "(cell)" in line], lines


def test_the_jobs_table_has_readable_headers_and_says_cpu_for_a_job_without_gpus(shell) -> None:
    shown(shell, "%%kcoral\n1\n")  # through the jobs API: one finished job at least
    table = shown(shell, "%kcoral jobs")[-1]
    plain, html = table["text/plain"], table["text/html"]
    header = plain.splitlines()[0].split()
    assert header == ["job", "status", "worker", "GPUs", "submitted", "took"]
    for title in ("job", "worker", "GPUs", "submitted", "took"):
        assert f"<th>{title}</th>" in html
    first = plain.splitlines()[1]
    assert "  cpu  " in first and "[]" not in plain and "UTC" in first and " ms" in first
    assert "None" not in plain
