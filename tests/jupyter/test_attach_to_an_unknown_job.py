"""``%kcoral attach ID`` of a job the server does not have, against the real CPU server of the
Jupyter tests: the status line says the refusal, naming the server, instead of being left
at ``attached to job ID`` (README: the status line says only what is true)."""

from __future__ import annotations

import pytest
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
    assert status_lines[-1] == f"kcoral: ERROR · {refused.value.cause}", status_lines
