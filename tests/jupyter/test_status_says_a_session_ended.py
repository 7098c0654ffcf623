"""``%kcoral status`` says when the kernel's session has ended. After the server ended a
``%kcoral session start --idle 20`` session for idleness (its panel card said ``ended: idle
too long``, and the next cell failed ``SessionEndedError``), ``%kcoral status`` still listed
``session 20016ca8-... on http://...`` as the session cells run in. An in-process shell
against a real CPU server."""

from __future__ import annotations

import json
import time

import pytest
from IPython.utils.capture import capture_output
from kcoral_shell import kcoral_shell

import kcoral

pytestmark = pytest.mark.timeout(300)


def status_text(ip) -> str:
    with capture_output() as captured:
        ip.run_line_magic("kcoral", "status")
    return "\n".join(o.data["text/plain"] for o in captured.outputs)


def test_status_says_the_session_the_server_ended_has_ended(server_factory, monkeypatch) -> None:
    server = server_factory("--num-workers", "1", "--max-sessions", "1")
    with kcoral_shell(server.url, monkeypatch, ()) as ip:
        sessions = ip.magics_manager.registry["KCoralMagics"].kernel.sessions
        try:
            with capture_output():
                ip.run_line_magic("kcoral", "session start --idle 1")
            session_id = sessions.current.id
            live = status_text(ip)
            assert f"{session_id} on {server.url}" in live and "ended" not in live, live
            # The server ends it after a second without a program: wait for its record.
            with kcoral.Client(server.url) as client:
                deadline = time.monotonic() + 60
                while True:
                    answer = client.request("GET", f"/v1/sessions/{session_id}")
                    if json.loads(bytes(answer.data))["state"] == "ENDED":
                        break
                    assert time.monotonic() < deadline, "the idle session never ended"
                    time.sleep(0.1)
            ended = status_text(ip)
            assert f"{session_id} on {server.url} (ended: " in ended, ended
        finally:
            sessions.current = None
