"""What a configured KCoral server can make the server extension do: answer its calls,
nothing more. A redirect is not followed (to another address the Jupyter host reaches,
with the user's Cancel), an answer without a body (204, 304) is a 502 in words, and a
``/health`` or ``/v1/info`` that is not a JSON object is that server's ``error``, never a
500 for the whole list; a configured address that is no server address is listed with its
``error`` and a warning in the log, never dropped in silence. A real Jupyter server with
the extension; the odd servers are stand-in Tornado apps on loopback."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import tornado.httpclient
import tornado.web
from stand_in_http import serving_app
from stand_in_kcoral import HEALTH, extension_config
from traitlets.config import Config

pytestmark = pytest.mark.timeout(180)

INFO = {"kcoral": "0", "protocol": 1, "features": ["jobs"], "device": "cpu"}


class Elsewhere(tornado.web.RequestHandler):
    """An address the Jupyter host reaches that no one configured: records every call."""

    calls: ClassVar[list[str]] = []

    def prepare(self) -> None:
        Elsewhere.calls.append(f"{self.request.method} {self.request.path}")
        self.finish({"job_id": "victim", "status": "CANCELLED"})


class Odd(tornado.web.RequestHandler):
    """A KCoral server that answers ``/health`` well and the rest in the way of its
    ``mode``: "redirect" (307 to ``elsewhere``), "empty" (204, or 304 for job ``j304``),
    "list-info" (``/v1/info`` is a JSON list), "list-health" (``/health`` is one),
    "mixed-features" (``features`` holds a number and an object besides strings; it knows
    job ``known``)."""

    def initialize(self, mode: str, elsewhere: str) -> None:
        self.mode, self.elsewhere = mode, elsewhere

    def answer(self, document: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(document))

    def get(self, path: str) -> None:
        if path == "health":
            return self.answer([1, 2] if self.mode == "list-health" else HEALTH)
        if self.mode == "redirect":
            return self.redirect(f"{self.elsewhere}/v1/jobs/victim", status=307)
        if self.mode == "empty" and path.startswith("v1/jobs/"):
            self.set_status(304 if path.startswith("v1/jobs/j304") else 204)
            return self.finish()
        if path == "v1/info":
            if self.mode == "list-info":
                return self.answer(["not", "an", "object"])
            if self.mode == "mixed-features":
                return self.answer(dict(INFO, features=["jobs", 3, {"x": 1}, "sessions"]))
            return self.answer(INFO)
        if path == "v1/jobs":
            return self.answer([])
        if path == "v1/jobs/known" and self.mode == "mixed-features":
            return self.answer({"job_id": "known", "status": "RUNNING"})
        self.set_status(404)
        self.answer({"error": {"kind": "not_found", "message": "no such job"}})

    def delete(self, path: str) -> None:
        if self.mode == "redirect":
            return self.redirect(f"{self.elsewhere}/v1/jobs/victim", status=307)
        self.set_status(204)
        self.finish()


MODES = ("redirect", "empty", "list-info", "list-health", "mixed-features")


@pytest.fixture(scope="module")
def odd_urls() -> Iterator[dict[str, str]]:
    with contextlib.ExitStack() as stack:
        elsewhere = stack.enter_context(
            serving_app(lambda: tornado.web.Application([(r"/.*", Elsewhere)]))
        )
        urls = {"elsewhere": elsewhere}
        for mode in MODES:
            routes = [(r"/(.*)", Odd, {"mode": mode, "elsewhere": elsewhere})]
            urls[mode] = stack.enter_context(
                serving_app(lambda routes=routes: tornado.web.Application(routes))
            )
        yield urls


@pytest.fixture
def jp_server_config(odd_urls: dict[str, str]) -> Config:
    servers: list[dict[str, Any]] = [
        {"name": mode, "url": odd_urls[mode], "token": f"token-of-{mode}"} for mode in MODES
    ]
    servers += [
        {"name": "typo", "url": "htp://gpu-box:8000", "token": "t"},
        {"name": "spaced", "url": "http://gpu box:8000"},
        {"name": "no url"},
    ]
    return extension_config(servers)


async def _servers(jp_fetch) -> dict[str, dict]:
    response = await jp_fetch("kcoral", "api", "servers")
    assert response.code == 200
    return {entry["name"]: entry for entry in json.loads(response.body)["servers"]}


async def _refused(jp_fetch, *path: str, method: str = "GET", server: str = "") -> tuple[int, dict]:
    params = {"server": server} if server else {}
    with pytest.raises(tornado.httpclient.HTTPClientError) as info:
        await jp_fetch("kcoral", "api", *path, method=method, params=params)
    return info.value.code, json.loads(info.value.response.body)


async def test_a_redirect_is_not_followed_and_is_named_in_words(jp_fetch, odd_urls) -> None:
    Elsewhere.calls.clear()
    where = f"{odd_urls['elsewhere']}/v1/jobs/victim"
    said = f"answered a redirect to {where} (HTTP 307); KCoral servers do not redirect"
    server = (await _servers(jp_fetch))["redirect"]
    assert server["health"]["status"] == "ok" and server["info"] is None
    assert server["error"].startswith(f"/v1/info: {said}")
    jobs = json.loads((await jp_fetch("kcoral", "api", "jobs")).body)
    notes = {e["server"]: e["message"] for e in jobs["errors"]}
    assert notes["redirect"].startswith(said)
    for method, path in (("DELETE", ("jobs", "j1")), ("GET", ("jobs", "j1", "events"))):
        code, body = await _refused(jp_fetch, *path, method=method)
        assert code == 502 and body["error"]["message"].startswith(said), (method, body)
    assert Elsewhere.calls == []  # the user's Cancel went nowhere else
    # Listed first, it hides no other server's job.
    known = json.loads((await jp_fetch("kcoral", "api", "jobs", "known")).body)
    assert known["server"] == "mixed-features"


async def test_an_answer_without_a_body_is_a_502_in_words(jp_fetch) -> None:
    for job, status in (("j1", 204), ("j304", 304)):
        code, body = await _refused(jp_fetch, "jobs", job, server="empty")
        assert code == 502
        assert body["error"]["message"] == (
            f"answered HTTP {status} without a body; a KCoral server answers with JSON"
        )
    code, body = await _refused(jp_fetch, "jobs", "j1", method="DELETE", server="empty")
    assert code == 502 and "HTTP 204 without a body" in body["error"]["message"]


async def test_health_or_info_that_is_not_an_object_is_that_servers_error(jp_fetch) -> None:
    servers = await _servers(jp_fetch)
    listed = servers["list-info"]
    assert listed["health"]["status"] == "ok" and listed["info"] is None
    assert listed["features"] == []
    assert listed["error"] == "answered /v1/info with something other than a JSON object"
    sick = servers["list-health"]
    assert sick["health"] is None and sick["reachable"] is True
    assert sick["error"] == "answered /health with something other than a JSON object"
    mixed = servers["mixed-features"]
    assert mixed["features"] == ["jobs", "sessions"] and "error" not in mixed


async def test_a_malformed_address_is_listed_with_its_error_and_not_warned_of_again_at_each_poll(
    jp_fetch, caplog: pytest.LogCaptureFixture
) -> None:
    servers = await _servers(jp_fetch)
    errors = {name: servers[name]["error"] for name in ("typo", "spaced", "no url")}
    assert errors["typo"] == (
        "not a server address: 'htp://gpu-box:8000': a server URL starts with http:// or "
        "https:// (fix c.KCoralExtension.servers[5] ('typo'))"
    )
    assert errors["spaced"].startswith("not a server address: 'http://gpu box:8000' must not")
    assert errors["no url"] == (
        "not a server address: it has no url (fix c.KCoralExtension.servers[7] ('no url'))"
    )
    for name in errors:
        assert servers[name]["reachable"] is False and servers[name]["health"] is None
    assert servers["typo"]["url"] == "htp://gpu-box:8000" and servers["typo"]["label"] == "typo"
    jobs = json.loads((await jp_fetch("kcoral", "api", "jobs")).body)
    assert {e["server"]: e["message"] for e in jobs["errors"]}["typo"] == errors["typo"]
    await _servers(jp_fetch)  # polled again
    # warned once, as the extension loads (d7370ce; test_server_extension_load_line pins that
    # warning), and never again as the panel polls
    warning = "KCoral: c.KCoralExtension.servers[5] ('typo') is not used: not a server address"
    assert warning not in caplog.text, caplog.text


async def test_a_malformed_kcoral_url_is_listed_with_its_error(
    jp_fetch, jp_serverapp, monkeypatch
) -> None:
    monkeypatch.setattr(jp_serverapp.web_app.settings["kcoral_extension"], "servers", [])
    monkeypatch.setenv("KCORAL_URL", "http://my gpu:8000")
    server = (await _servers(jp_fetch))["default"]
    assert server["error"].startswith("not a server address: 'http://my gpu:8000' must not")
    assert server["error"].endswith("(fix KCORAL_URL)") and server["url"] == "http://my gpu:8000"
