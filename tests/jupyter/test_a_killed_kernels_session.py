"""A kernel that dies without exiting leaves its session to the idle timeout, and a new
kernel ends it as the README says (``%kcoral session list``, ``attach ID``, ``stop``). A real
kernel (jupyter_client) killed with SIGKILL, then an in-process shell, against a real CPU
server with one session seat."""

from __future__ import annotations

import re

import pytest
from IPython.utils.capture import capture_output
from jupyter_client.manager import start_new_kernel
from kcoral_jupyter.extension import kernel_state_of
from kcoral_shell import kcoral_shell

import kcoral

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_killed_kernels_session_holds_its_seat_until_a_new_kernel_attaches_and_stops_it(
    server_factory, monkeypatch
) -> None:
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    monkeypatch.setenv("KCORAL_URL", server.url)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    manager, kernel = start_new_kernel(kernel_name="python3")
    printed: list[str] = []
    try:
        kernel.execute_interactive(
            "%load_ext kcoral\n%kcoral session start",
            output_hook=lambda m: printed.append(m["content"].get("text", "")),
            timeout=120,
        )
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)  # killed: no exit hook runs
    match = re.search(r"kcoral: session id ([0-9a-f-]{36})", "".join(printed))
    assert match, printed
    session_id = match.group(1)
    with kcoral.Client(server.url) as client:
        assert client.attach_session(session_id).record["state"] == "IDLE"
    with kcoral_shell(server.url, monkeypatch, ()) as ip:
        try:
            with capture_output() as listed:
                ip.run_line_magic("kcoral", "session list")
            assert f"{session_id}  IDLE" in listed.stdout
            with capture_output():
                full = ip.run_cell("%kcoral session start").error_in_exec
                assert "%kcoral session attach ID, then %kcoral session stop" in str(full)
                ip.run_line_magic("kcoral", f"session attach {session_id}")
                ip.run_line_magic("kcoral", "session stop")
                ip.run_line_magic("kcoral", "session start")  # the seat is free again
            assert kernel_state_of(ip).sessions.current.id != session_id
        finally:
            sessions = kernel_state_of(ip).sessions
            if sessions.current is not None:
                sessions.current.handle.close()
            sessions.current = None
    with kcoral.Client(server.url) as client:
        assert client.attach_session(session_id).record["end_reason"] == "deleted"
