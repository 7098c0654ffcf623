"""``%kcoral version`` names the server cells would use, or says truly why there is none,
in the shell of the Jupyter tests (real CPU servers). After a failed ``%kcoral connect`` it
printed the configured server's version (or "none yet (the first cell starts the embedded
one)") while every cell refused to run, unconnected; after ``%kcoral local stop`` it said
"none yet", as if no server had ever run."""

from __future__ import annotations

import pytest
from kcoral_jupyter.cell_errors import NotConnectedError, ServerUnreachableError

pytestmark = pytest.mark.timeout(180)


def version_lines(shell, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    shell.run_line_magic("kcoral", "version")
    return capsys.readouterr().out.splitlines()


def test_after_a_failed_connect_version_says_the_kernel_is_unconnected(
    shell, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ServerUnreachableError):
        shell.run_line_magic("kcoral", "connect 127.0.0.1:9")
    said = version_lines(shell, capsys)
    assert said[1].startswith(
        "server: not connected (%kcoral connect http://127.0.0.1:9 failed: "
    ), said
    with pytest.raises(NotConnectedError):  # what version now says
        shell.run_cell_magic("kcoral", "", "1\n")


def test_after_the_local_server_stopped_version_says_so(
    embedded_shell, capsys: pytest.CaptureFixture[str]
) -> None:
    embedded_shell.run_line_magic("kcoral", "local start")
    embedded_shell.run_line_magic("kcoral", "local stop")
    said = version_lines(embedded_shell, capsys)
    assert said[1] == "server: none (the local server stopped; the next cell starts a new one)"
