"""``%kcoral session list`` says why each ended session ended, and attaching an ended one
says nothing was attached. In-process IPython shells against a real CPU server."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output
from kcoral_jupyter.cell_errors import SessionEndedError
from kcoral_shell import kcoral_shell

import kcoral

pytestmark = pytest.mark.timeout(300)


def test_session_list_says_why_each_ended_session_ended(server_factory, monkeypatch) -> None:
    # Before: "<id>  ENDED  0 programs  CPU", the same for a stop, an idle timeout, a crash;
    # then "ENDED (deleted)", the API's word, after a kernel's restart had ended it.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    with kcoral.Client(server.url) as client:
        stopped = client.session()
        stopped.close()
        with client.session() as live:
            with kcoral_shell(server.url, monkeypatch, ()) as ip, capture_output() as listed:
                ip.run_line_magic("kcoral", "session list")
    lines = listed.stdout.splitlines()
    assert f"{stopped.id}  ENDED (stopped)  0 programs  CPU" in lines, lines
    assert f"{live.id}  IDLE  0 programs  CPU" in lines, lines


def test_attaching_an_ended_session_says_nothing_was_attached(server_factory, monkeypatch) -> None:
    # Before: "... %kcoral session stop runs cells without one", for a session this kernel
    # never attached (its stop then said "no session in this kernel").
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    with kcoral.Client(server.url) as client:
        ended = client.session()
        ended.close()
    with kcoral_shell(server.url, monkeypatch, ()) as ip, capture_output():
        error = ip.run_cell(f"%kcoral session attach {ended.id}").error_in_exec
    assert isinstance(error, SessionEndedError), error
    assert error._render_traceback_() == [
        f"SessionEndedError: session {ended.id[:8]} on {server.url} ended by its owner",
        "nothing was attached: %kcoral session list shows your sessions, %kcoral session "
        "start begins a new one",
    ]


def test_session_list_lists_the_sessions_where_the_servers_info_fails(
    server_factory, monkeypatch
) -> None:
    # Before: the list asked /v1/info who the caller is after it had the sessions, and its
    # failure (a router relaying it to a node that stopped answering) lost the whole list.
    server = server_factory("--num-workers", "1", "--max-sessions", "1")

    def info_fails(self: kcoral.Client) -> dict:
        raise kcoral.TransportError(f"cannot reach {server.url}: no answer within 30 s")

    with kcoral.Client(server.url) as client, client.session() as live:
        with kcoral_shell(server.url, monkeypatch, ()) as ip, capture_output() as listed:
            ip.run_line_magic("kcoral", "session list")  # the kernel knows the server now
            monkeypatch.setattr(kcoral.Client, "info", info_fails)
            ip.run_line_magic("kcoral", "session list")
    # named where who asks is not known: a caller's own session says "owner default"
    assert listed.stdout.splitlines() == [
        f"{live.id}  IDLE  0 programs  CPU",
        f"{live.id}  IDLE  0 programs  CPU  owner default",
    ]
