"""A session cell interrupted (Jupyter's Stop: SIGINT to a real kernel) when its program
has not started, or when it completes all the same: each time the cell says what happened
to the program and the session keeps its state (EXTENSIONS §11). Found in a real kernel
against a server started as the README starts one (its token): both read 'KeyboardInterrupt
raised in session …'s program … its program stopped and the session keeps its state', and
the next cell found ``x`` changed by the cell the user had stopped. A real CPU server with a
client token. Waiting to start: the previous cell leaves garbage whose collection (the
worker's clean-up, SERVER §6) waits for a file the test writes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager, start_new_kernel
from server_process import client_token_file
from waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOKEN = "alice-token-0123456789abcdef"


def slow_clean_up_cell(held: Path, go: Path) -> str:
    """A cell whose garbage only the worker's clean-up collects (automatic collection
    off); its finaliser writes ``held`` and waits for ``go``."""
    return (
        "%%kcoral --quiet\nimport gc, os, time\nclass Garbage:\n    def __del__(self):\n"
        f"        open({str(held)!r}, 'w').close()\n"
        "        deadline = time.monotonic() + 60\n"
        f"        while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "            time.sleep(0.01)\n"
        "gc.disable()\ngarbage = Garbage()\ngarbage.me = garbage\ndel garbage\n"
    )


@contextmanager
def kernel(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KernelManager, Any]]:
    monkeypatch.setenv("KCORAL_URL", url)
    monkeypatch.setenv("KCORAL_TOKEN", TOKEN)
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)  # its exit hook ends the session


def said_by(client: Any, sent: str, until_submitted: bool = False) -> tuple[list[str], list[str]]:
    """The status lines and the error lines of the cell ``sent``: up to its job's
    submission (``until_submitted``), else to its end."""
    lines: list[str] = []
    error: list[str] = []
    while True:
        message = client.get_iopub_msg(timeout=120)
        if message["parent_header"].get("msg_id") != sent:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind in ("display_data", "update_display_data"):
            lines.append(content["data"].get("text/plain", ""))
            if until_submitted and "job " in lines[-1]:
                return lines, error
        elif kind == "error":
            error = content["traceback"]
        elif kind == "status" and content["execution_state"] == "idle":
            return lines, error


def session_label(lines: list[str]) -> str:
    """The session's short id as the cell's status lines name it; each line true as it is
    said (a terminal IPython prints every one): none says a program that never got an
    interrupt stopped on one."""
    assert not [line for line in lines if "program has stopped" in line], lines
    label = re.search(r"session ([0-9a-f]{8})", "\n".join(lines))
    assert label, lines
    return label.group(1)


def x_in_the_next_cell(client: Any) -> str:
    printed: list[str] = []
    client.execute_interactive(
        "%%kcoral --quiet\nprint(x)",
        output_hook=lambda m: printed.append(m["content"].get("text", "")),
    )
    return "".join(printed).strip()


def test_a_session_cell_interrupted_while_it_waits_to_start_never_runs_and_says_so(
    server_factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\n")
    server = server_factory("--max-sessions", "1", "--auth-token-file", str(tokens))
    held, go = tmp_path / "held", tmp_path / "go"
    with kernel(server.url, monkeypatch) as (manager, client):
        try:
            started = client.execute_interactive("%load_ext kcoral\n%kcoral session start")
            assert started["content"]["status"] == "ok"
            client.execute_interactive("%%kcoral --quiet\nx = 41")
            client.execute_interactive(slow_clean_up_cell(held, go))
            wait_for(held.exists, "the worker's clean-up after the cell to begin")
            sent = client.execute("%%kcoral\nx = x + 1\nprint('ran: x is', x)")
            said_by(client, sent, until_submitted=True)  # its job waits to start
            manager.interrupt_kernel()
            lines, error = said_by(client, sent)
        finally:
            go.touch()
        label = session_label(lines)
        assert error == [
            f"CellCancelledError: interrupted before it started: session {label}'s "
            f"program on {server.url} never ran",
            "the session keeps its state: run the next cell",
        ], lines
        assert lines[-1].startswith("kcoral: interrupted before it started: the cell never ran")
        assert x_in_the_next_cell(client) == "41"


def test_a_session_cell_whose_program_completes_despite_the_interrupt_says_so(
    server_factory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the program ignores the interrupt (as code that catches KeyboardInterrupt does, or
    # one interrupted in the worker's own code as it returns its results) and completes
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\n")
    server = server_factory("--max-sessions", "1", "--auth-token-file", str(tokens))
    go = tmp_path / "go"
    with kernel(server.url, monkeypatch) as (manager, client):
        try:
            client.execute_interactive("%load_ext kcoral\n%kcoral session start")
            client.execute_interactive("%%kcoral --quiet\nx = 41")
            sent = client.execute(
                "%%kcoral\nimport os, signal, time\nsignal.signal(signal.SIGINT, lambda *_: None)\n"
                "print('ignoring interrupts', flush=True)\n"
                f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\nx = 42\n"
            )
            while True:  # until the program has said it ignores interrupts
                message = client.get_iopub_msg(timeout=120)
                content = message["content"]
                if message["parent_header"].get("msg_id") == sent and "ignoring" in str(
                    content.get("text", "")
                ):
                    break
            manager.interrupt_kernel()
        finally:
            go.touch()
        lines, error = said_by(client, sent)
        assert error == [
            f"CellCancelledError: interrupted, but session {session_label(lines)}'s program on "
            f"{server.url} completed (the interrupt came as it finished, or it caught the "
            "KeyboardInterrupt)",
            "what it changed in the session is kept; its results were not brought back: run "
            "the next cell",
        ], lines
        assert lines[-1].startswith("kcoral: interrupted, but the cell completed in session")
        assert x_in_the_next_cell(client) == "42"
