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
from stand_in_http import StandIn, serving

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


# A clipboard write, a window title and a status query a server sends in a failure's text:
# the cell's own exception's message (a malicious server sends any), or a refusal's message.
HOSTILE = "\x1b]52;c;cm0gLXJmIH4K\x07boom \x1b]0;owned\x07 \x1b[6n"
RAISES = (
    "raise ValueError('\\\\x1b]52;c;cm0gLXJmIH4K\\\\x07boom \\\\x1b]0;owned\\\\x07 \\\\x1b[6n')"
)


def _reached(seen: str) -> list[str]:
    # IPython titles the window itself (OSC 0 "IPython: ..."): only the server's title counts
    return [s for s in ("\x1b]52", "\x1b]0;owned", "\x1b[6n") if s in seen]


@pytest.mark.slow
def test_a_failed_cells_message_and_traceback_cannot_write_the_clipboard(tmp_path: Path) -> None:
    # Before: RemoteCellError's line and its remote traceback reached the terminal as sent.
    server = start_server(tmp_path)
    try:
        seen = ipython_on_a_terminal(server.url, RAISES).decode("utf-8", "replace")
    finally:
        server.stop()
    assert "kcoral: FAILED" in seen, repr(seen)
    assert "failed: runtime: ValueError: boom  \r\n" in seen, repr(seen)
    assert "Remote traceback:" in seen, repr(seen)
    assert _reached(seen) == [], repr(seen)


class _RefusesEveryProgram(StandIn):
    """A server that answers every program with a refusal made for the user's terminal."""

    def do_GET(self) -> None:
        if self.path == "/health":
            return self.send_json({"status": "ok"})
        self.send_json({"kcoral": "0.1.0", "protocol_version": 1, "features": ["jobs"]})

    def do_POST(self) -> None:
        self.read_body()
        refusal = {"kind": "forbidden", "message": HOSTILE}
        self.send_json({"status": "ERROR", "error": refusal}, 403)


def test_a_servers_refusal_of_a_cell_cannot_write_the_clipboard(tmp_path: Path) -> None:
    with serving(_RefusesEveryProgram) as url:
        seen = ipython_on_a_terminal(url, "x = 1").decode("utf-8", "replace")
    assert "HTTP 403" in seen and "boom" in seen, repr(seen)
    assert _reached(seen) == [], repr(seen)


class _HostileListings(StandIn):
    """A server whose health, info and job list carry text made for the user's terminal."""

    def do_GET(self) -> None:
        if self.path == "/health":
            document: object = {"status": "ok", "note": HOSTILE}
        elif self.path.startswith("/v1/jobs"):
            job = {"job_id": "j-1", "status": "RUNNING", "worker_id": HOSTILE, "gpu_ids": []}
            document = [job]
        else:
            document = {"kcoral": "0.1.0", "protocol_version": 1, "features": ["jobs"]}
            document[HOSTILE] = HOSTILE  # a key of its own, and its value
        self.send_json(document)


def test_a_servers_words_in_status_and_jobs_cannot_write_the_clipboard(tmp_path: Path) -> None:
    # Before: %kcoral status and %kcoral jobs printed the server's keys and values as sent.
    lines = "\\n".join(("%kcoral status", "%kcoral jobs"))
    code = (
        "get_ipython().run_line_magic('load_ext', 'kcoral_jupyter'); "
        f"get_ipython().run_cell('{lines}')"
    )
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_TOKEN"}
    with serving(_HostileListings) as url:
        environment["KCORAL_URL"] = url
        command = [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "-c", code]
        _status, raw = on_a_terminal(command, environment)
    seen = raw.decode("utf-8", "replace")
    assert "health.note: boom" in seen and "RUNNING" in seen, repr(seen)
    assert _reached(seen) == [], repr(seen)
