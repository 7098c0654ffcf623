"""Attack: a malicious server's text in the client's own errors and warnings, on the user's
terminal (CLIENT_API §9).

A script that calls the client prints what a server sent wherever Python prints an
uncaught error or a warning: the user's terminal. A terminal acts on escape strings there:
OSC 52 writes the clipboard, OSC 0 retitles the window, ``CSI 6 n`` makes the terminal type
its answer as if the user had. The failure's note (the remote traceback) and a function's
prints were screened already (``test_remote_prints_reach_the_caller.py``); the error's own
line above the note, an HTTP error's message and the version warning were not: each reached
the terminal byte for byte. Each is now screened like the note (colours kept), and the
error keeps the server's text whole for a program that reads it (``message``, ``result``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pseudo_terminal import on_a_terminal
from server_process import client_token_file
from stand_in_http import StandIn, serving

TOKEN = "tok-terminal-escapes-7d1f"
# a clipboard write, a window title and a status query, around a coloured word
HOSTILE = "\x1b]52;c;cm0gLXJmIH4K\x07boom \x1b]0;owned\x1b\\ \x1b[6n \x1b[31mred\x1b[0m"
DANGEROUS = ("\x1b]52", "\x1b]0;", "\x1b[6n")


def _reached(seen: bytes) -> list[str]:
    text = seen.decode("utf-8", "replace")
    return [sequence for sequence in DANGEROUS if sequence in text]


def _script(tmp_path: Path, source: str) -> list[str]:
    path = tmp_path / "user_script.py"
    path.write_text(source)
    return [sys.executable, str(path)]


RAISES = """
import sys
import kcoral

client = kcoral.Client(sys.argv[1], token=sys.argv[2])

def raises_escapes():
    raise ValueError({hostile!r})

client.function()(raises_escapes).remote()
"""


@pytest.mark.slow
def test_a_remote_failures_message_cannot_write_the_clipboard_of_the_users_terminal(
    server_factory, tmp_path: Path
) -> None:
    # What the server sends as the failure's message: here the function's own exception
    # (a malicious server sends any text there, the same way).
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\n")
    server = server_factory("--auth-token-file", str(tokens))
    command = _script(tmp_path, RAISES.format(hostile=HOSTILE))
    status, seen = on_a_terminal([*command, server.url, TOKEN])
    text = seen.decode("utf-8", "replace")
    assert status == 1, text
    assert "RemoteExecutionError: Remote execution" in text, text
    assert _reached(seen) == [], repr(text)
    assert "runtime: ValueError: boom   \x1b[31mred\x1b[0m" in text, repr(text)


class _HostileRefusal(StandIn):
    """A server that refuses every program with a message made for the user's terminal,
    and says its version in one too."""

    def do_GET(self) -> None:
        self.send_json({"kcoral": "9.9" + HOSTILE, "protocol_version": 1})

    def do_POST(self) -> None:
        self.read_body()
        error = {"kind": "forbidden", "message": HOSTILE}
        self.send_json({"status": "ERROR", "error": error}, 403)


EXECUTES = """
import sys
import kcoral

client = kcoral.Client(sys.argv[1])
program = kcoral.Program()
program.upload(id="m", kind="module", source="x = 1")
client.execute(program)
"""

ASKS_INFO = """
import sys
import kcoral

kcoral.Client(sys.argv[1]).info()
print("asked")
"""


def test_an_http_errors_message_cannot_write_the_clipboard_of_the_users_terminal(
    tmp_path: Path,
) -> None:
    with serving(_HostileRefusal) as url:
        status, seen = on_a_terminal([*_script(tmp_path, EXECUTES), url])
    text = seen.decode("utf-8", "replace")
    assert status == 1, text
    assert "KCoralError: HTTP 403: boom" in text, repr(text)
    assert _reached(seen) == [], repr(text)


def test_an_http_error_keeps_the_servers_message_whole_for_a_program() -> None:
    from kcoral.errors import KCoralError

    error = KCoralError(403, HOSTILE, kind="forbidden")
    assert error.message == HOSTILE
    assert str(error) == "HTTP 403: boom   \x1b[31mred\x1b[0m"


def test_a_servers_version_in_the_clients_warning_cannot_write_the_clipboard(
    tmp_path: Path,
) -> None:
    with serving(_HostileRefusal) as url:
        status, seen = on_a_terminal([*_script(tmp_path, ASKS_INFO), url])
    text = seen.decode("utf-8", "replace")
    assert status == 0, text
    assert "KCoral server version 9.9boom" in text and "asked" in text, repr(text)
    assert _reached(seen) == [], repr(text)
