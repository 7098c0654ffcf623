"""A kernel's session whose server is gone: what the notebook says. In-process shells against
the embedded server (``embedded_shell``, Linux only) and a real CPU server of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import (
    ServerUnreachableError,
    SessionEndedError,
    SessionSeatsFullError,
)
from kcoral_jupyter.extension import kernel_state_of
from kcoral_shell import kcoral_shell
from server_process import client_token_file

import kcoral

pytestmark = pytest.mark.timeout(300)

ALICE = "token-alice-0123456789"
BOB = "token-bob-0123456789"


def run(ip: Any, source: str) -> tuple[Any, Any]:
    with capture_output() as captured:
        result = ip.run_cell(source)
    return result, captured


def two_lines(result: Any, kind: type[Exception]) -> list[str]:
    error = result.error_in_exec
    assert isinstance(error, kind), error
    lines = list(error._render_traceback_())
    assert len(lines) == 2, lines
    return lines


def test_stopping_the_local_server_says_its_session_ended_and_later_cells_say_so_too(
    embedded_shell,
) -> None:
    # Before: the stop said only "local server stopped", the next cell "no answer from URL
    # ... %kcoral local start gives this kernel its own", and after that start the session
    # cells still went to the dead address with the same advice.
    run(embedded_shell, "%kcoral session start")
    label = kernel_state_of(embedded_shell).sessions.current.label
    run(embedded_shell, "%%kcoral\nx = 1\n")
    _, stopped = run(embedded_shell, "%kcoral local stop")
    assert stopped.stdout.splitlines()[-1] == (
        f"kcoral: local server stopped; {label} ended with it (its state is gone)"
    )
    run(embedded_shell, "%kcoral local start")
    for source in ("%%kcoral\nx\n", "%kcoral session status"):
        lines = two_lines(run(embedded_shell, source)[0], SessionEndedError)
        assert lines[0].endswith(
            "has ended: this kernel's local server stopped, and its sessions ended with it"
        ), lines
        assert "%kcoral session start begins a new session" in lines[1]
    run(embedded_shell, "%kcoral session stop")
    result, _ = run(embedded_shell, "%%kcoral\n2\n")  # on the new local server, no session
    assert result.error_in_exec is None and result.result == 2


def test_a_session_on_a_local_server_that_exited_is_said_to_have_ended_with_it(
    embedded_shell,
) -> None:
    run(embedded_shell, "%kcoral session start")
    local = kernel_state_of(embedded_shell).local
    assert local is not None and local.process is not None
    local.process.kill()  # it died (out of memory, say): the kernel did not stop it
    local.process.wait(10)
    lines = two_lines(run(embedded_shell, "%%kcoral\n1\n")[0], SessionEndedError)
    assert "this kernel's local server stopped, and its sessions ended with it" in lines[0]


@pytest.fixture
def session_shell(server_factory, monkeypatch) -> Iterator[tuple[Any, Any]]:
    """An in-process shell whose cells go to a server of the test's own (one session seat);
    the session a test leaves is dropped from the kernel."""
    server = server_factory("--num-workers", "1", "--max-sessions", "1", name="first")
    with kcoral_shell(server.url, monkeypatch, ("x",)) as ip:
        try:
            yield ip, server
        finally:
            kernel_state_of(ip).sessions.current = None


def test_a_session_cell_whose_server_does_not_answer_says_to_stop_the_session_not_to_connect(
    session_shell,
) -> None:
    # Before: "start the server there ... or %kcoral connect to one that runs; %kcoral local
    # start gives this kernel its own", and neither moves a session's cells anywhere.
    ip, server = session_shell
    run(ip, "%kcoral session start")
    label = kernel_state_of(ip).sessions.current.label
    server.stop()
    for source in ("%%kcoral\n1\n", "%kcoral session status"):
        lines = two_lines(run(ip, source)[0], ServerUnreachableError)
        assert lines[0].startswith(
            f"ServerUnreachableError: no answer from {server.url}, where {label} runs: "
        ), lines
        assert "%kcoral session stop runs cells without it" in lines[1]
        assert "local start" not in lines[1] and "connect" not in lines[1]


def test_stopping_a_session_whose_server_does_not_answer_says_the_kernel_left_it(
    session_shell,
) -> None:
    # Before: a ServerUnreachableError, although the kernel had left the session.
    ip, server = session_shell
    run(ip, "%kcoral session start")
    label = kernel_state_of(ip).sessions.current.label
    server.stop()
    result, captured = run(ip, "%kcoral session stop")
    assert result.error_in_exec is None, result.error_in_exec
    assert captured.stdout.startswith(f"kcoral: left {label}, but its server did not end it (")
    assert "cells run without a session again" in captured.stdout
    assert kernel_state_of(ip).sessions.current is None


def test_a_full_set_of_seats_says_how_to_end_a_session_another_kernel_holds(
    session_shell,
) -> None:
    # Before: "... has no session seat free: no session seat free (--max-sessions 1): ..."
    # and "(%kcoral session list, then stop it)", where %kcoral session stop ends only this
    # kernel's own session.
    ip, server = session_shell
    with kcoral.Client(server.url) as client, client.session():
        lines = two_lines(run(ip, "%kcoral session start")[0], SessionSeatsFullError)
    assert lines[0].startswith(
        f"SessionSeatsFullError: {server.url}: no session seat free (--max-sessions 1): "
    ), lines
    assert lines[0].count("no session seat free") == 1
    assert "%kcoral session attach ID, then %kcoral session stop" in lines[1]


def test_a_caller_at_its_per_identity_cap_is_told_the_flag_that_would_let_it_in(
    server_factory, tmp_path, monkeypatch
) -> None:
    # Before: "ask the operator for kcoral server --max-sessions N", with a seat still free.
    tokens = client_token_file(tmp_path, f"alice {ALICE}\nbob {BOB}\n")
    server = server_factory(
        "--num-workers", "1", "--max-sessions", "2", "--auth-token-file", str(tokens)
    )
    with kcoral_shell(server.url, monkeypatch, ()) as ip:
        ip.run_line_magic("config", f"KCoral.token = {ALICE!r}")
        with kcoral.Client(server.url, token=ALICE) as client, client.session():
            lines = two_lines(run(ip, "%kcoral session start")[0], SessionSeatsFullError)
    assert "(--max-sessions-per-identity 1)" in lines[0], lines
    assert lines[1].endswith("ask the operator for kcoral server --max-sessions-per-identity N")


def test_listing_sessions_starts_no_local_server_to_list_nothing(embedded_shell) -> None:
    # Before: the list started the embedded server (seconds), then said it had no sessions.
    _, listed = run(embedded_shell, "%kcoral session list")
    assert listed.stdout.strip() == (
        "kcoral: no sessions: no server configured, and this kernel's local server has not "
        "started yet"
    )
    assert kernel_state_of(embedded_shell).local is None
    run(embedded_shell, "%kcoral session start")
    run(embedded_shell, "%kcoral local stop")
    _, listed = run(embedded_shell, "%kcoral session list")
    assert listed.stdout.strip() == (
        "kcoral: no sessions: this kernel's local server has stopped, and its sessions ended "
        "with it"
    )
