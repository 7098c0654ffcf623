"""Bad input from a fuzz audit of the program path (2026-12), against a real server on
loopback, sent as raw HTTP as an attacker would.

* A job id whose percent-decoded bytes are not UTF-8 (``/v1/jobs/%ff``): Tornado refused
  the path itself, before the browser guard and the token check, and ``write_error`` could
  only call that 400 an ``engine`` fault (``internal server error``). It is an id this
  server never gave, so it now answers as any unknown job id does (EXTENSIONS §5: 404
  ``not_found``), after the guard and the token check.
"""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest
from identity_support import TOKEN_A, Answer, request, token_file

from kcoral.protocol.headers import is_canonical_uuid

NOT_UTF8_JOB_PATHS = [
    ("GET", "/v1/jobs/%ff"),
    ("DELETE", "/v1/jobs/%c0%80"),
    ("GET", "/v1/jobs/%ff/result"),
    ("GET", "/v1/jobs/%fe%ff/events"),
]


def _documented_error(answer: Answer, status: int, kind: str) -> None:
    assert answer.status == status, answer.raw
    assert answer.headers["content-type"] == "application/json"
    body = answer.json
    assert set(body) == {"status", "request_id", "error"} and body["status"] == "ERROR"
    assert is_canonical_uuid(body["request_id"])
    assert body["error"]["kind"] == kind, body


@pytest.fixture
def guarded_server(server_factory, tmp_path: Path):
    return server_factory("--auth-token-file", str(token_file(tmp_path / "secrets")))


@pytest.mark.parametrize(("method", "path"), NOT_UTF8_JOB_PATHS)
def test_a_job_id_that_is_not_utf8_is_an_unknown_job_after_the_token_check(
    guarded_server, method: str, path: str
) -> None:
    url = guarded_server.url
    _documented_error(request(url, method, path), 401, "unauthorized")
    _documented_error(request(url, method, path, TOKEN_A), 404, "not_found")
    assert request(url, "GET", "/v1/jobs", TOKEN_A).json == []
    assert "Traceback" not in guarded_server.stderr()


def test_a_web_page_asking_for_a_job_id_that_is_not_utf8_is_refused_as_a_web_page(
    guarded_server,
) -> None:
    # The guard runs on the request head before anything else (EXTENSIONS §6); Tornado's
    # refusal of the path came before it.
    connection = http.client.HTTPConnection(guarded_server.host, guarded_server.port, timeout=60)
    try:
        connection.request("GET", "/v1/jobs/%ff", headers={"Origin": "http://evil.example"})
        response = connection.getresponse()
        headers = {name.lower(): value for name, value in response.getheaders()}
        answer = Answer(response.status, headers, response.read())
    finally:
        connection.close()
    _documented_error(answer, 403, "forbidden")
