"""``%kcoral local log``: the embedded server's log stays in its file (issue 29.8) and this
is the switch that shows its end. The server is real, a ``kcoral server`` child of this
process started as a kernel starts it."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from kcoral_jupyter.extension import kernel_state_of

pytestmark = pytest.mark.timeout(300)


def test_the_embedded_servers_log_stays_out_of_the_notebook_until_local_log_shows_it(
    embedded_shell, capfd: pytest.CaptureFixture[str]
) -> None:
    embedded_shell.run_line_magic("kcoral", "local start")
    url = embedded_shell.run_line_magic("kcoral", "url")
    started = capfd.readouterr()
    # Only the magic's own lines that say where cells run; none of the server's.
    lines = started.out.splitlines()
    assert lines and all(line.startswith("kcoral: ") for line in lines), lines
    assert url in lines[-1] and started.err == ""
    embedded_shell.run_line_magic("kcoral", "local log 200")
    shown = capfd.readouterr().out
    path = kernel_state_of(embedded_shell).local.log_path
    # A log shorter than asked: the count says what is shown (it said 200 before).
    said, _, log = shown.partition("\n")
    assert said == f"kcoral: the last {len(log.splitlines())} lines of {path}", said
    assert 1 < len(log.splitlines()) < 200
    # The server's own start-up messages (SERVER §12) are in its log, with its URL.
    assert url.rsplit(":", 1)[1] in shown.split("\n", 1)[1]


def test_local_log_without_a_local_server_says_so_and_bad_counts_are_refused(
    embedded_shell, capsys: pytest.CaptureFixture[str]
) -> None:
    embedded_shell.run_line_magic("kcoral", "local log")
    assert "no local server" in capsys.readouterr().out
    for bad in ("local log 0", "local log many", "local log 1 2"):
        with pytest.raises(UsageError):
            embedded_shell.run_line_magic("kcoral", bad)
