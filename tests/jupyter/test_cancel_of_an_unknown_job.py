"""``%kcoral cancel ID`` of a job the server does not have, against the real CPU server of
the Jupyter tests: the refusal names the server that answered, as ``%kcoral attach``'s does.
Before, it read ``HTTP 404 not_found: job not found`` with no address, where the attach of
the same id said ``<url> answered HTTP 404 not_found: job not found``."""

from __future__ import annotations

import pytest
from kcoral_jupyter.cell_errors import ServerRefusedError

UNKNOWN_JOB = "0b5e9a7c-0000-4000-8000-000000000001"


def test_cancelling_an_unknown_job_names_the_server_that_answered(shell, cpu_server_url) -> None:
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_line_magic("kcoral", f"cancel {UNKNOWN_JOB}")
    assert refused.value.status_code == 404
    assert refused.value.cause.startswith(
        f"{cpu_server_url} answered HTTP 404 not_found: job not found"
    )
