"""A remote tool's escape sequences against the user's terminal (CLIENT_API §11): through a
real `kcoral run` and server, a pseudo-terminal gets the colours and not the clipboard write,
the title or the status query; a pipe gets every byte as the tool wrote it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pseudo_terminal import on_a_terminal

# What a malicious server (or another user's tool on it) prints: colour around a clipboard
# write, a retitled window, and a query the terminal answers by typing into kcoral's input.
PRINTS = (
    "import sys; sys.stdout.write('\\x1b[31mred\\x1b[0m \\x1b]52;c;cm0gLXJmIH4K\\x07"
    "\\x1b]0;owned\\x1b\\\\ \\x1b[6n done\\n'); "
    "sys.stderr.write('err \\x1b]52;c;eA==\\x07\\x1b[1mbold\\x1b[0m\\n')"
)
COLOURED = "\x1b[31mred\x1b[0m"


def _command(server_url: str) -> list[str]:
    return [sys.executable, "-m", "kcoral", "run", "python", "--url", server_url, "--"]


@pytest.mark.slow
def test_a_terminal_gets_the_tools_colours_but_not_its_clipboard_write_or_queries(
    server_url: str, in_tmp: Path
) -> None:
    status, seen = on_a_terminal([*_command(server_url), "-c", PRINTS])
    text = seen.decode("utf-8", "replace")
    assert status == 0, text
    assert f"{COLOURED}   done\r\n" in text, repr(text)
    assert "err \x1b[1mbold\x1b[0m\r\n" in text, repr(text)
    assert "]52" not in text and "owned" not in text and "\x1b[6n" not in text, repr(text)


@pytest.mark.slow
def test_a_pipe_gets_every_byte_the_tool_wrote(server_url: str, in_tmp: Path) -> None:
    done = subprocess.run(
        [*_command(server_url), "-c", PRINTS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"{COLOURED} \x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;owned\x1b\\ \x1b[6n done\n"
    )
    assert done.stderr == "err \x1b]52;c;eA==\x07\x1b[1mbold\x1b[0m\n"


def test_kcoral_runs_own_lines_write_a_servers_control_characters_as_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a missing output's path and reason come from the server: a line break in them would
    # forge a line of kcoral run's own, an escape would act on the terminal
    from kcoral.run.outputs import say

    say("missing output out/\x1b]52;c;eA==\x07x: gone\nkcoral run: all good \udc9b6n")
    assert capsys.readouterr().err == (
        "kcoral run: missing output out/\\x1b]52;c;eA==\\x07x: gone\\x0akcoral run: all good"
        " \\x9b6n\n"
    )


@pytest.mark.slow
def test_what_a_tool_left_set_on_the_terminal_is_undone_before_the_prompt(
    server_url: str, in_tmp: Path
) -> None:
    # a hidden cursor and red text left on: the shell's prompt after kcoral run was red,
    # without a cursor, until the user typed `reset`
    leaves = "import sys; sys.stdout.write('\\x1b[?25l\\x1b[31mred, and never reset')"
    status, seen = on_a_terminal([*_command(server_url), "-c", leaves])
    text = seen.decode("utf-8", "replace")
    assert status == 0, text
    undone = text.split("red, and never reset", 1)[1]
    assert undone in ("\x1b[0m\x1b[?25h", "\x1b[?25h\x1b[0m"), repr(text)
