"""A configured KCoral server that answers 200 for every job id (malicious or broken),
listed before the server that holds the job: before, the server extension took the first
answer other than 404, so that server got the user's Cancel and the job ran on. Now every
server is asked; two claims are a 409 naming both, and nothing is cancelled until the user
picks one (``?server=``). A real Jupyter server with the extension; the two KCoral servers
are stand-in Tornado apps on loopback."""

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


class Stand(tornado.web.RequestHandler):
    """``claims``: answers 200 for any job id; else it holds job ``known`` alone."""

    cancels: ClassVar[list[str]] = []

    def initialize(self, name: str, claims: bool) -> None:
        self.name, self.claims = name, claims

    def answer(self, document: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(document))

    def get(self, path: str) -> None:
        if path == "health":
            return self.answer(HEALTH)
        job = path.removeprefix("v1/jobs/")
        if job != path and (self.claims or job == "known"):
            # the real job's record names its request; a server claiming every id cannot
            request = "req-of-known" if job == "known" and not self.claims else f"req-{job}"
            return self.answer({"job_id": job, "request_id": request, "status": "RUNNING"})
        self.set_status(404)
        self.answer({"error": {"kind": "not_found", "message": "no such job"}})

    def delete(self, path: str) -> None:
        Stand.cancels.append(f"{self.name} {path}")
        self.answer({"job_id": path.removeprefix("v1/jobs/"), "status": "CANCELLED"})


@pytest.fixture(scope="module")
def stand_urls() -> Iterator[dict[str, str]]:
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, claims in (("claims-every-id", True), ("real", False)):
            routes = [(r"/(.*)", Stand, {"name": name, "claims": claims})]
            urls[name] = stack.enter_context(
                serving_app(lambda routes=routes: tornado.web.Application(routes))
            )
        yield urls


@pytest.fixture
def jp_server_config(stand_urls: dict[str, str]) -> Config:
    servers = [{"name": name, "url": url} for name, url in stand_urls.items()]
    # the real server once more, its address spelled another way: one server, two names
    servers.append(
        {"name": "real-again", "url": stand_urls["real"].replace("127.0.0.1", "localhost")}
    )
    return extension_config(servers)


async def test_a_server_claiming_every_job_id_cannot_take_another_servers_cancel(jp_fetch) -> None:
    Stand.cancels.clear()
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await jp_fetch("kcoral", "api", "jobs", "known", method="DELETE")
    assert refused.value.code == 409
    message = json.loads(refused.value.response.body)["message"]
    assert "'claims-every-id', 'real', 'real-again'" in message and "?server=NAME" in message
    assert Stand.cancels == []  # nothing cancelled anywhere
    chosen = await jp_fetch(
        "kcoral", "api", "jobs", "known", method="DELETE", params={"server": "real"}
    )
    assert json.loads(chosen.body)["status"] == "CANCELLED"
    assert Stand.cancels == ["real v1/jobs/known"]


async def test_a_job_two_servers_claim_is_shown_from_neither(jp_fetch) -> None:
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await jp_fetch("kcoral", "api", "jobs", "known")
    assert refused.value.code == 409
    shown = await jp_fetch("kcoral", "api", "jobs", "known", params={"server": "real"})
    assert json.loads(shown.body)["server"] == "real"
