"""What a remote function prints reaches the caller's own stdout and stderr.

``f.remote()`` dropped it: only ``f.execute()``'s ``ProgramResult`` held it, so a ``print``
added to debug a remote function showed nothing.
"""

from __future__ import annotations

import asyncio
import io
import sys

import pytest
from pseudo_terminal import read_until

import kcoral
from kcoral.errors import PrintedOutput, RemoteExecutionError
from kcoral.remote.report import show_output


def chatty(n):
    import sys

    print("out", n)
    print("err", n, file=sys.stderr)
    if n < 0:
        raise ValueError("negative")
    return n


def many_lines(n):
    for i in range(n):
        print("line", i)
    return n


@pytest.fixture(scope="module")
def client(server_url: str):
    with kcoral.Client(server_url) as client:
        yield client


@pytest.mark.parametrize("serialization", ["json", "pickle"])
def test_what_a_remote_function_prints_reaches_the_callers_stdout_and_stderr(
    client, capsys, serialization
) -> None:
    assert client.function(serialization=serialization)(chatty).remote(2) == 2
    assert capsys.readouterr() == ("out 2\n", "err 2\n")


def test_a_failed_call_shows_what_it_printed_too(client, capsys) -> None:
    with pytest.raises(RemoteExecutionError):
        client.function()(chatty).remote(-1)
    assert capsys.readouterr() == ("out -1\n", "err -1\n")


def test_a_run_async_call_shows_it_too(client, capsys) -> None:
    assert asyncio.run(client.function()(chatty).remote(3, run_async=True)) == 3
    assert capsys.readouterr() == ("out 3\n", "err 3\n")


def test_output_cut_at_the_limit_says_so_and_how_to_raise_it(client, capsys) -> None:
    assert client.function(output_limit_bytes=16)(many_lines).remote(50) == 50
    out = capsys.readouterr().out
    assert out.startswith("line 0\n")
    assert out.endswith(
        "[kcoral: the remote stdout was cut at the output limit; raise it with "
        "@client.function(output_limit_bytes=...)]\n"
    )


def test_execute_prints_nothing_and_keeps_the_output_in_its_result(client, capsys) -> None:
    result = client.function()(chatty).execute(4)
    assert (result.stdout, result.stderr) == ("out 4\n", "err 4\n")
    assert capsys.readouterr() == ("", "")


def prints_escapes():
    print("\x1b[32mgreen\x1b[0m \x1b]52;c;cm0gLXJmIH4K\x07\x1b[6n done\x1b[?25l")
    return 0


def raises_escapes():
    raise ValueError("\x1b]52;c;cm0gLXJmIH4K\x07boom \x1b[31mred\x1b[0m")


def test_a_terminal_gets_the_functions_colours_but_not_a_servers_clipboard_write(
    client, monkeypatch
) -> None:
    # the caller's stdout is a terminal (a pseudo-terminal here): what a malicious server
    # sends as the function's output must not write the clipboard or query the terminal
    import os
    import pty

    terminal, screen = pty.openpty()
    with open(screen, "w", closefd=True) as stdout:
        monkeypatch.setattr("sys.stdout", stdout)
        assert client.function()(prints_escapes).remote() == 0
        stdout.flush()
        seen = read_until(terminal, "\x1b[?25h")
    os.close(terminal)
    # the cursor it hid is shown again after its output
    assert seen == "\x1b[32mgreen\x1b[0m  done\x1b[?25l\r\n\x1b[?25h", repr(seen)


def test_a_failures_note_drops_the_escapes_a_server_could_use_on_a_terminal(client) -> None:
    with pytest.raises(RemoteExecutionError) as caught:
        client.function()(raises_escapes).remote()
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert "ValueError: boom \x1b[31mred\x1b[0m" in note and "\x1b]52" not in note, note


def closed_file() -> io.StringIO:
    closed = io.StringIO()
    closed.close()
    return closed


@pytest.mark.parametrize("closed_name", ["stdout", "stderr"])
def test_a_closed_stream_of_the_callers_loses_nothing_the_other_can_show(
    monkeypatch: pytest.MonkeyPatch, closed_name: str
) -> None:
    open_name = "stderr" if closed_name == "stdout" else "stdout"
    still_open = io.StringIO()
    monkeypatch.setattr(sys, closed_name, closed_file())
    monkeypatch.setattr(sys, open_name, still_open)
    show_output(PrintedOutput("out\n", "err\n", stdout_truncated=True, stderr_truncated=True))
    shown = still_open.getvalue()
    printed = {"stdout": "out", "stderr": "err"}[open_name]
    assert shown.startswith(f"{printed}\n[kcoral: the remote {open_name} was cut"), shown


def test_a_call_whose_caller_closed_stderr_still_returns_its_value(
    client: kcoral.Client, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", closed_file())
    assert client.function()(chatty).remote(4) == 4
    assert capsys.readouterr().out == "out 4\n"
