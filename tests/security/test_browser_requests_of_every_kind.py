"""The other requests a web page can make of a ``kcoral server`` on loopback (EXTENSIONS §6,
"Browsers"), beside the form post and rebound ``Host`` of ``test_browser_requests``:

* ``fetch(url, {method: "POST", mode: "no-cors", body: text})``: a ``text/plain`` body, the
  other body a page sends without a CORS preflight, holding the program as JSON;
* ``new EventSource(url)``: a job's live output (``GET /v1/jobs/{id}/events``), which a
  page could read once the server answered it;
* ``new WebSocket("ws://127.0.0.1:PORT/...")``: no preflight, no CORS, the page reads every
  frame, so only the server's own ``Origin`` check stands in the way;
* a ``file:`` page: browsers send ``Origin: null`` (refused in the other file) or, in some,
  ``Origin: file://``.

Each is sent as a browser sends it, to a real server, and is refused with ``403 forbidden``
before anything runs or streams.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_browser_requests import EVIL, assert_forbidden, marker_program, send

import kcoral


def text_post(url: str, path: str, marker: Path, **headers: str) -> tuple[int, dict]:
    body = json.dumps(marker_program(marker)).encode()
    return send(
        url, "POST", path, body=body, content_type="text/plain;charset=UTF-8", headers=headers
    )


def test_a_text_plain_post_from_another_origin_is_refused_and_runs_nothing(
    kcoral_server, tmp_path: Path
):
    marker = tmp_path / "ran"
    for path in ("/execute", "/v1/jobs"):
        assert_forbidden(
            text_post(kcoral_server.url, path, marker, Origin=EVIL), "--allowed-origin"
        )
    assert not marker.exists(), "the page's program ran"
    # Without the Origin the same request reaches the body's checks (/execute takes only
    # multipart): the page's 403 came first, before the body was looked at.
    status, document = text_post(kcoral_server.url, "/execute", marker)
    assert (status, document["error"]["kind"]) == (400, "parse"), document


def test_a_page_cannot_read_a_jobs_live_output_with_an_event_source(kcoral_server):
    program = kcoral.Program()
    program.return_(key="k", value=program.upload(kind="bytes", value=b"secret", id="k"))
    job = kcoral.Client(kcoral_server.url).submit(program)
    path = f"/v1/jobs/{job.id}/events"
    for origin in (EVIL, "null"):
        assert_forbidden(
            send(
                kcoral_server.url,
                "GET",
                path,
                headers={"Origin": origin, "Accept": "text/event-stream"},
            ),
            "Origin",
        )
    job.result()  # the job itself, and its owner's stream, are untouched


def test_a_websocket_handshake_from_another_origin_is_refused(kcoral_server):
    handshake = {
        "Origin": EVIL,
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    for path in ("/execute", "/v1/jobs", "/v1/info"):
        assert_forbidden(
            send(kcoral_server.url, "GET", path, headers=handshake), "--allowed-origin"
        )


def test_a_file_page_is_a_web_page_whichever_origin_its_browser_sends(
    kcoral_server, tmp_path: Path
):
    marker = tmp_path / "ran"
    for origin in ("file://", "null"):
        assert_forbidden(text_post(kcoral_server.url, "/execute", marker, Origin=origin), "Origin")
    assert not marker.exists(), "the file page's program ran"
