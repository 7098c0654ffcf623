"""``kcoral server --no-log-console`` writes no Tornado access lines either, but those of
refused callers (401, 403), which have no event of their own (SERVER §13).

Before, every answer of 400 or above still put ``401 GET /v1/info (127.0.0.1) 0.30ms`` on
the server's stderr, though the operator had asked for no console log; the router never
wrote them. With the console on, the lines stay.
"""

from __future__ import annotations

import re
from pathlib import Path

from http_helpers import get, request
from server_process import RunningServer, start_server

TOKEN = "ops-client-token-0123456789"
ACCESS_LINE = re.compile(r"^\d{3} (GET|POST) /\S* \(")


def _refused_three_ways(server: RunningServer) -> None:
    assert get(server.url, "/v1/info", {"Authorization": "Bearer wrong"}).status == 401
    assert get(server.url, "/nowhere").status == 401
    bearer = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    assert request(server.url, "POST", "/execute", b"{", bearer).status == 400


def _access_lines(tmp_path: Path, *args: str) -> tuple[list[str], list[dict]]:
    server = start_server(tmp_path, ["--num-workers", "1", *args], env={"KCORAL_AUTH_TOKEN": TOKEN})
    try:
        _refused_three_ways(server)
    finally:
        assert server.stop() == 0
    lines = [line for line in server.stderr().splitlines() if ACCESS_LINE.match(line)]
    return lines, server.events()


def test_no_log_console_leaves_only_the_refused_callers_access_lines_on_stderr(
    tmp_path: Path,
) -> None:
    lines, events = _access_lines(tmp_path, "--no-log-console")
    # A wrong token is the one trace an operator must find: it has no event.
    assert [line.split(" (")[0] for line in lines] == ["401 GET /v1/info", "401 GET /nowhere"]
    # the event log is untouched: the malformed program is still recorded there
    finished = [e for e in events if e["event"] == "request_finished"]
    assert [e["http_status"] for e in finished] == [400], finished


def test_with_the_console_on_each_refusal_keeps_its_access_line(tmp_path: Path) -> None:
    lines, _ = _access_lines(tmp_path)
    assert [line.split(" (")[0] for line in lines] == [
        "401 GET /v1/info",
        "401 GET /nowhere",
        "400 POST /execute",
    ], lines
