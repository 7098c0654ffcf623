"""Raw-HTTP session requests for the front-end's session tests (EXTENSIONS §11): create a
session, run a program in it (or statelessly), and read one call's value."""

from __future__ import annotations

import json

from http_helpers import Response, execute_body, request


def create_session(url: str, headers: dict[str, str] | None = None, **body: object) -> Response:
    """``POST /v1/sessions`` with ``body`` as its JSON options."""
    return request(url, "POST", "/v1/sessions", json.dumps(body).encode(), headers)


def run_in(
    url: str, session_id: str | None, program: dict, headers: dict[str, str] | None = None
) -> Response:
    """``program`` in session ``session_id``, or on a stateless worker for ``None``."""
    content_type, body = execute_body(program)
    path = "/execute" if session_id is None else f"/v1/sessions/{session_id}/execute"
    return request(url, "POST", path, body, {"Content-Type": content_type, **(headers or {})})


def value_of(answer: Response, name: str) -> object:
    """The JSON value call ``name`` returned in a completed answer."""
    assert answer.status == 200, answer.body
    assert answer.body["status"] == "COMPLETED", answer.body
    return json.loads(answer.body["results"][f"{name}#0"]["value"])
