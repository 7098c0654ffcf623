"""A KCoral server whose answers the extension cannot take is that server's problem, never a
500 (or a memory spike) for every server of the panel:

* JSON nested deeper than the parser goes (a few hundred KiB of ``[``): Python's decoder
  raises ``RecursionError``, not a ``ValueError``;
* well-formed answers over the 16 MiB the extension reads: before, each poll read an answer
  whole (up to Tornado's 100 MB) and decoded it, so a rogue server held hundreds of MB of
  the Jupyter server every few seconds, and a 400,000-job list went to the browser.

A real Jupyter server with the extension; the servers are stand-in Tornado apps on loopback,
beside a healthy one."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import tornado.web
from stand_in_http import serving_app
from stand_in_kcoral import HEALTH, extension_config
from traitlets.config import Config

pytestmark = pytest.mark.timeout(180)

INFO = {"kcoral": "0", "protocol": 1, "features": ["jobs"], "device": "cpu"}
DEEP = b"[" * 200_000 + b"]" * 200_000
#: valid answers, each a little over the 16 MiB the extension reads
PADDING = "x" * (17 << 20)
TOO_MANY_JOBS = [{"job_id": f"j{i}", "status": "RUNNING"} for i in range(400_000)]


class Answering(tornado.web.RequestHandler):
    """``deep``: every answer is DEEP; ``huge``: well-formed answers over 16 MiB; else a
    healthy server with one running job."""

    def initialize(self, odd: str) -> None:
        self.odd = odd

    def answer(self, document: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(DEEP if self.odd == "deep" else json.dumps(document))

    def get(self, path: str) -> None:
        huge = self.odd == "huge"
        if path == "health":
            return self.answer({**HEALTH, "padding": PADDING} if huge else HEALTH)
        if path == "v1/info":
            return self.answer(INFO)
        if path == "v1/jobs":
            return self.answer(TOO_MANY_JOBS if huge else [{"job_id": "fine", "status": "RUNNING"}])
        if path == "v1/sessions":
            return self.answer([])
        self.set_status(404)
        self.answer({"error": {"kind": "not_found", "message": "no such job"}})


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(
                serving_app(
                    lambda odd=name: tornado.web.Application([(r"/(.*)", Answering, {"odd": odd})])
                )
            )
            for name in ("deep", "huge", "healthy")
        }


@pytest.fixture
def jp_server_config(urls: dict[str, str]) -> Config:
    return extension_config([{"name": name, "url": url} for name, url in urls.items()])


async def test_servers_answering_too_deep_or_too_much_leave_the_others_listed(jp_fetch):
    response = await jp_fetch("kcoral", "api", "servers")
    assert response.code == 200
    servers = {entry["name"]: entry for entry in json.loads(response.body)["servers"]}
    assert servers["deep"]["error"]
    assert "answered more than 16 MiB" in servers["huge"]["error"]
    assert "error" not in servers["healthy"]


async def test_servers_answering_too_deep_or_too_much_leave_the_others_jobs_listed(jp_fetch):
    response = await jp_fetch("kcoral", "api", "jobs")
    assert response.code == 200
    listed = json.loads(response.body)
    assert [(job["job_id"], job["server"]) for job in listed["jobs"]] == [("fine", "healthy")]
    errors = {error["server"]: error["message"] for error in listed["errors"]}
    assert set(errors) == {"deep", "huge"}
    assert "answered more than 16 MiB" in errors["huge"]
