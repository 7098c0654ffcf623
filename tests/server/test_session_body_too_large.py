"""``POST /v1/sessions`` with a body over its fixed 64 KiB (real server, tokens on): the 413
names both sizes and says that no flag moves the limit, as the other 413s of the server name
their sizes and flag (EXTENSIONS §10). Before, it was PROTOCOL's text alone, ``request
exceeds the configured size limit``, which named no size and no limit."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from raw_http import connection
from server_process import RunningServer, running_server

TOKEN = "session-body-test-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("session-body")
    tokens = directory / "tokens"
    tokens.write_text(f"alice {TOKEN}\n")
    tokens.chmod(0o600)
    with running_server(directory / "server", ["--auth-token-file", str(tokens)]) as running:
        yield running


def test_a_session_body_over_its_fixed_limit_names_both_sizes(server: RunningServer) -> None:
    body = json.dumps({"gpu_count": None, "padding": "x" * 70000}).encode()
    link = connection(server.url)
    link.request(
        "POST",
        "/v1/sessions",
        body=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    answer = link.getresponse()
    assert answer.status == 413
    error = json.loads(answer.read())["error"]
    assert error == {
        "kind": "request_too_large",
        "message": f"request exceeds the configured size limit: {len(body)} bytes, limit "
        "65536 bytes (fixed: a session body holds only gpu_count and idle_timeout_seconds)",
    }
