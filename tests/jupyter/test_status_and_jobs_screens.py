"""What a cell's status line and ``%kcoral jobs`` show (issue 29 points 5 and 11): only what
is true, in words a user reads. An in-process shell against a real CPU server."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.utils.capture import capture_output
from stand_in_http import StandIn, serving

from kcoral.jobs import decode_job_list

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
    assert "kcoral: sending n" in lines
    assert any(line.startswith("kcoral: running") and " · job " in line for line in lines), lines
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


class ListsWithGaps(StandIn):
    """A router whose job list is cut at its limit and misses two away nodes' jobs."""

    def do_GET(self) -> None:
        record = {
            "job_id": "c84f8fc6-1d2e-4f00-8a00-000000000001",
            "status": "COMPLETED",
            "submitted_at": "2026-12-06T09:00:00.000001Z",
        }
        left_out = {"X-KCoral-Jobs-Left-Out": "3", "X-KCoral-Nodes-Left-Out": "gpu-b,gpu-c"}
        self.send_json([record] if self.path.startswith("/v1/jobs") else {}, 200, left_out)


def test_a_job_list_missing_older_jobs_or_away_nodes_says_so_under_the_table(shell) -> None:
    # A router left an away node's jobs out of its list without a word (router mend).
    with serving(ListsWithGaps) as url, capture_output() as captured:
        shell.run_line_magic("kcoral", f"jobs {url}")
    assert "c84f8fc6" in captured.outputs[-1].data["text/plain"]
    assert captured.stdout.strip() == (
        f"kcoral: 3 older jobs not listed (%kcoral jobs --limit 4 {url} lists them); "
        "not listed: the jobs of nodes gpu-b, gpu-c "
        "(away or not answering)"
    )


def test_a_job_lists_gaps_are_read_from_its_headers_and_bounded() -> None:
    body = b'[{"job_id": "j"}]'
    whole = decode_job_list(body, {})
    assert whole == [{"job_id": "j"}] and whole.whole
    cut = decode_job_list(body, {"X-KCoral-Jobs-Left-Out": "12", "X-KCoral-Nodes-Left-Out": "a, b"})
    assert (cut.left_out, cut.nodes_left_out, cut.whole) == (12, ("a", "b"), False)
    hostile = {
        "X-KCoral-Jobs-Left-Out": "-1" + "9" * 40,
        "X-KCoral-Nodes-Left-Out": ",".join(["n" * 500] * 1000) + ",\x1b[2J",
    }
    bounded = decode_job_list(body, hostile)
    assert bounded.left_out == 0
    assert len(bounded.nodes_left_out) == 64 and {len(n) for n in bounded.nodes_left_out} == {128}
