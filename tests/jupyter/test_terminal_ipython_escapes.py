"""``%%kcoral`` in IPython on a terminal (CLIENT_API §11's rule for ``kcoral run``): a cell's
output keeps its colours, and the escapes a server could use on the terminal (a clipboard
write, a status query) never reach it. A notebook renders only colours, so it needs none."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from pseudo_terminal import on_a_terminal
from server_process import start_server

CELL = (
    "import sys; sys.stdout.write('\\\\x1b[31mred\\\\x1b[0m \\\\x1b]52;c;cm0gLXJmIH4K\\\\x07"
    "\\\\x1b[6n done\\\\n')"
)


def ipython_on_a_terminal(url: str, cell: str = CELL) -> bytes:
    code = (
        "get_ipython().run_line_magic('load_ext', 'kcoral_jupyter'); "
        f"get_ipython().run_cell_magic('kcoral', '', \"{cell}\")"
    )
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_TOKEN"}
    environment["KCORAL_URL"] = url
    command = [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "-c", code]
    _status, seen = on_a_terminal(command, environment)
    return seen


@pytest.mark.slow
def test_a_cell_in_terminal_ipython_shows_colours_but_not_a_clipboard_write(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path)
    try:
        seen = ipython_on_a_terminal(server.url).decode("utf-8", "replace")
    finally:
        server.stop()
    assert "kcoral: COMPLETED" in seen, seen
    assert "\x1b[31mred\x1b[0m  done\r\n" in seen, repr(seen)
    assert "]52;" not in seen and "\x1b[6n" not in seen, repr(seen)


@pytest.mark.slow
def test_what_a_cell_left_set_on_the_terminal_is_undone_before_its_status_line(
    tmp_path: Path,
) -> None:
    # a hidden cursor and red text left on: the status line and IPython's prompt were red
    leaves = "import sys; sys.stdout.write('\\\\x1b[?25l\\\\x1b[31mred, never reset\\\\n')"
    server = start_server(tmp_path)
    try:
        seen = ipython_on_a_terminal(server.url, leaves).decode("utf-8", "replace")
    finally:
        server.stop()
    after = seen.split("red, never reset", 1)[1].split("kcoral:", 1)[0]
    assert "\x1b[0m" in after and "\x1b[?25h" in after, repr(seen)
