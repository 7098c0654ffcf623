"""``%kcoral attach ID`` of a job the server does not have (and ``attach``/``cancel`` of
something that is no job id), against the real CPU server of the
Jupyter tests: a notebook's status line says the refusal, naming the server, instead of
being left at ``attached to job ID`` (README: the status line says only what is true); a
terminal, which prints every line, says ``attaching``, then only the error."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import ServerRefusedError

pytestmark = pytest.mark.timeout(120)


def test_attaching_an_unknown_job_leaves_no_attached_status_line(
    shell, cpu_server_url, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_line_magic("kcoral", "attach 0b5e9a7c-0000-4000-8000-000000000000")
    assert refused.value.status_code == 404
    assert refused.value.cause.startswith(f"{cpu_server_url} answered HTTP 404 not_found")
    status_lines = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("kcoral: ")
    ]
    # A terminal prints every line: none may say it attached (before: "kcoral: attached to
    # job ID" above the 404), and the error printed next is not said twice (before: "kcoral:
    # ERROR · " and the same words above it).
    assert status_lines == ["kcoral: attaching to job 0b5e9a7c-0000-4000-8000-000000000000"]


def test_a_notebook_line_of_an_unknown_job_ends_at_the_refusal(shell, cpu_server_url) -> None:
    # A front end that updates in place (a notebook): the line says the refusal.
    with capture_output() as seen, pytest.raises(ServerRefusedError) as refused:
        shell.run_line_magic("kcoral", "attach 0b5e9a7c-0000-4000-8000-000000000000")
    last = seen.outputs[-1].data["text/plain"]
    assert last == f"kcoral: ERROR · {refused.value.cause}", last


@pytest.mark.parametrize("command", ["attach", "cancel"])
def test_an_argument_that_is_no_job_id_is_refused_in_one_line(shell, command: str) -> None:
    # It raised the client's ValueError with a traceback through the extension's frames,
    # where %kcoral session attach already refused such an id in one line.
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("kcoral", f"{command} ../jobs")
    assert str(refused.value) == f"%kcoral {command}: '../jobs' is not a job id"
