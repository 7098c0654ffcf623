"""``%kcoral session start`` refusals that are not about its seats or its options, against
the real CPU server of the Jupyter tests. A server that does not fit ``--select`` answers
``503 no_matching_node``; the magic took every 503 for a full server and said
``... has no session seat free: this server does not fit the selector gpu=h100 ...``, then
sent the user to end sessions or ask for ``--max-sessions``, none of which helps. An
``--idle`` no server takes was refused naming the client's ``idle_timeout``."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from kcoral_jupyter.cell_errors import ServerRefusedError


def test_a_selector_the_server_does_not_fit_is_not_called_a_full_server(
    shell, cpu_server_url
) -> None:
    with pytest.raises(ServerRefusedError) as refused:
        shell.run_line_magic("kcoral", "session start --select gpu=h100")
    assert refused.value.cause.startswith(
        f"{cpu_server_url} answered HTTP 503 no_matching_node: this server does not fit the "
        "selector gpu=h100"
    )
    assert "seat" not in refused.value.cause
    assert refused.value.action == (
        "%kcoral status shows what the server (or a router's fleet) offers: change --select "
        "to fit it"
    )


@pytest.mark.parametrize("idle", ["0", "-5", "nan", "inf"])
def test_an_idle_time_no_server_takes_is_refused_naming_idle(shell, idle: str) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("kcoral", f"session start --idle {idle}")
    assert str(refused.value) == (
        f"%kcoral session start: --idle must be a number of seconds above 0, not {float(idle):g}"
    )
