"""``%kcoral jobs`` against a server with more jobs than it lists, in the shell of the
Jupyter tests (real CPU server): the newest 20 by default, ``--limit N`` for another count,
and a note under the table with the command that lists the rest. Before, it asked for the
server's default of 1000 rows and had no way to ask for fewer or more."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from kcoral import Client, Program

#: ``%kcoral jobs``'s default count (``options.JOBS_LISTED``).
DEFAULT_LISTED = 20


def job_rows(table: str) -> list[str]:
    return [line for line in table.splitlines()[1:] if line.strip()]


@pytest.fixture
def many_jobs(cpu_server_url: str) -> int:
    """At least one job more than ``%kcoral jobs`` lists by default, all finished."""
    client = Client(cpu_server_url)
    program = Program()
    program.upload(kind="bytes", value=b"x", id="x")
    for job in [client.submit(program) for _ in range(DEFAULT_LISTED + 1)]:
        job.wait()
    return len(client.jobs(limit=10000))


def test_jobs_lists_the_newest_twenty_and_says_how_to_list_the_rest(shell, many_jobs) -> None:
    with capture_output() as captured:
        shell.run_line_magic("kcoral", "jobs")
    assert len(job_rows(captured.outputs[-1].data["text/plain"])) == DEFAULT_LISTED
    older = many_jobs - DEFAULT_LISTED
    assert captured.stdout.strip() == (
        f"kcoral: {older} older job{'s' if older != 1 else ''} not listed "
        f"(%kcoral jobs --limit {many_jobs} lists them)"
    )


def test_jobs_limit_lists_as_many_as_asked(shell, many_jobs) -> None:
    with capture_output() as captured:
        shell.run_line_magic("kcoral", "jobs --limit 3")
    assert len(job_rows(captured.outputs[-1].data["text/plain"])) == 3
    with capture_output() as captured:
        shell.run_line_magic("kcoral", f"jobs --limit {many_jobs}")
    assert len(job_rows(captured.outputs[-1].data["text/plain"])) == many_jobs
    assert captured.stdout == ""


@pytest.mark.parametrize("count", ["0", "10001", "many"])
def test_a_limit_no_server_lists_is_refused_in_one_line(shell, count: str) -> None:
    with pytest.raises(UsageError, match="N is a whole number from 1 to 10000"):
        shell.run_line_magic("kcoral", f"jobs --limit {count}")
