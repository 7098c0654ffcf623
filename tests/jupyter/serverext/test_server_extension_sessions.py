"""The server extension's session routes (issue 23.5) against a real KCoral server: the
panel lists every server's sessions and stops one, with the KCoral token kept in the
Jupyter server and Jupyter's own authentication and XSRF rules in front."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest
import tornado.httpclient
from jupyter_login import login_cookies
from server_process import running_server
from stand_in_http import StandIn, serving
from traitlets.config import Config

from kcoral import Client

pytestmark = pytest.mark.timeout(180)

TOKEN = "server-side-secret"


@pytest.fixture(scope="module")
def sessions_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A CPU server that requires TOKEN, with two session seats."""
    with running_server(
        tmp_path_factory.mktemp("sessions-server"),
        ["--log-dir", "", "--max-sessions", "2"],
        env={"KCORAL_AUTH_TOKEN": TOKEN},
    ) as server:
        yield server.url


class _WithoutSessions(StandIn):
    """A server that knows only the published protocol: no sessions, every path recorded."""

    paths: ClassVar[list[str]] = []
    lock = threading.Lock()

    def _answer(self) -> None:
        with self.lock:
            self.paths.append(f"{self.command} {self.path}")
        if self.path == "/v1/info":
            body, status = {"kcoral": "0", "protocol": 1, "features": []}, 200
        else:
            body, status = {"error": {"kind": "not_found", "message": "no such path"}}, 404
        self.send_json(body, status)

    do_GET = do_DELETE = _answer


@pytest.fixture(scope="module")
def plain_server_url() -> Iterator[str]:
    with serving(_WithoutSessions) as url:
        yield url


@pytest.fixture
def jp_server_config(sessions_server_url: str, plain_server_url: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {
                "servers": [
                    {"name": "cpu", "url": sessions_server_url, "token": TOKEN},
                    {"name": "plain", "url": plain_server_url},
                    {"name": "gone", "url": "http://127.0.0.1:9"},
                ]
            },
        }
    )


@pytest.fixture
def client(sessions_server_url: str) -> Client:
    return Client(sessions_server_url, token=TOKEN)


def _ids(document: dict) -> list[str]:
    return [s["session_id"] for s in document["sessions"]]


async def test_the_sessions_of_a_server_are_listed_tagged_with_it_and_without_its_token(
    jp_fetch, client
) -> None:
    with client.session() as session:
        response = await jp_fetch("kcoral", "api", "sessions")
        body = response.body.decode()
        assert TOKEN not in body
        document = json.loads(body)
        assert session.id in _ids(document)
        record = next(s for s in document["sessions"] if s["session_id"] == session.id)
        assert record["server"] == "cpu"
        assert record["owner"] == "default" and record["state"] in ("IDLE", "STARTING")
        # The KCoral server's clock when it answered, for the panel's idle times.
        assert abs(record["observed_at"] - time.time()) < 120


async def test_servers_without_sessions_or_out_of_reach_add_no_rows_and_no_errors(
    jp_fetch,
) -> None:
    document = json.loads((await jp_fetch("kcoral", "api", "sessions")).body)
    assert {s["server"] for s in document["sessions"]} <= {"cpu"}
    assert document["errors"] == []


async def test_a_server_that_refuses_the_token_is_named_in_the_errors(
    jp_fetch, jp_serverapp, sessions_server_url
) -> None:
    extension = jp_serverapp.web_app.settings["kcoral_extension"]
    extension.servers = [
        *extension.servers,
        {"name": "wrong-token", "url": sessions_server_url, "token": "not-it"},
    ]
    document = json.loads((await jp_fetch("kcoral", "api", "sessions")).body)
    errors = {e["server"]: e["message"] for e in document["errors"]}
    assert list(errors) == ["wrong-token"]
    assert errors["wrong-token"] == "refused the token configured for it (HTTP 401)"
    assert "not-it" not in json.dumps(document)


async def test_stopping_a_session_through_the_extension_ends_it_as_deleted(
    jp_fetch, client
) -> None:
    session = client.session()
    try:
        response = await jp_fetch(
            "kcoral", "api", "sessions", session.id, method="DELETE", params={"server": "cpu"}
        )
        answer = json.loads(response.body)
        assert answer["state"] == "ENDED" and answer["end_reason"] == "deleted"
        assert answer["server"] == "cpu"
        record = json.loads(bytes(client.request("GET", f"/v1/sessions/{session.id}").data))
        assert record["state"] == "ENDED" and record["end_reason"] == "deleted"
        # Without ?server= the extension finds the server that knows the session.
        again = await jp_fetch("kcoral", "api", "sessions", session.id, method="DELETE")
        assert json.loads(again.body)["state"] == "ENDED"
        read = await jp_fetch("kcoral", "api", "sessions", session.id)
        assert json.loads(read.body)["end_reason"] == "deleted"
    finally:
        session.close()


async def test_an_unknown_session_or_server_is_404(jp_fetch) -> None:
    unknown = "0b8e6f1c-2f4b-4c59-9f1e-6f3a1f1f2c11"
    for method in ("GET", "DELETE"):
        with pytest.raises(tornado.httpclient.HTTPClientError) as info:
            await jp_fetch("kcoral", "api", "sessions", unknown, method=method)
        assert info.value.code == 404
    with pytest.raises(tornado.httpclient.HTTPClientError) as info:
        await jp_fetch(
            "kcoral", "api", "sessions", unknown, method="DELETE", params={"server": "nope"}
        )
    assert info.value.code == 404


async def test_a_session_id_cannot_reach_another_route_of_the_servers(jp_fetch) -> None:
    # A page that got the XSRF token still cannot turn "stop session X" into another call:
    # an id that is not one path segment of letters, digits, - and _ is asked of no server.
    _WithoutSessions.paths.clear()
    for crafted in ("..%2Fjobs%2Fx", "..", "x%3Fy", "a.b"):
        with pytest.raises(tornado.httpclient.HTTPClientError) as info:
            await jp_fetch("kcoral", "api", "sessions", crafted, method="DELETE")
        assert info.value.code == 404
    assert _WithoutSessions.paths == []


async def test_an_unauthenticated_request_is_refused(http_server_client, jp_base_url) -> None:
    for method, path in (("GET", "sessions"), ("GET", "sessions/x"), ("DELETE", "sessions/x")):
        with pytest.raises(tornado.httpclient.HTTPClientError) as info:
            await http_server_client.fetch(
                f"{jp_base_url}kcoral/api/{path}",
                method=method,
                allow_nonstandard_methods=True,
            )
        assert info.value.code == 403


async def test_another_sites_page_cannot_stop_a_session_with_the_users_cookie(
    http_server_client, jp_base_url, jp_auth_header, client
) -> None:
    cookies = await login_cookies(http_server_client, jp_base_url, jp_auth_header)
    with client.session() as session:
        # Another site's page: Jupyter blocks the cross-origin call (it answers 404) ...
        cross_site = await http_server_client.fetch(
            f"{jp_base_url}kcoral/api/sessions/{session.id}",
            method="DELETE",
            headers={"Cookie": cookies, "Origin": "http://evil.example"},
            raise_error=False,
        )
        # ... and a request that only carries the cookie (a form or an image elsewhere)
        # lacks the XSRF token.
        no_xsrf = await http_server_client.fetch(
            f"{jp_base_url}kcoral/api/sessions/{session.id}",
            method="DELETE",
            headers={"Cookie": cookies},
            raise_error=False,
        )
        assert (cross_site.code, no_xsrf.code) == (404, 403)
        record = json.loads(bytes(client.request("GET", f"/v1/sessions/{session.id}").data))
        assert record["state"] != "ENDED"
