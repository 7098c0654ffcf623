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
CODE = (
    "get_ipython().run_line_magic('load_ext', 'kcoral_jupyter'); "
    f"get_ipython().run_cell_magic('kcoral', '', \"{CELL}\")"
)


def ipython_on_a_terminal(url: str) -> bytes:
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_TOKEN"}
    environment["KCORAL_URL"] = url
    command = [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "-c", CODE]
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
