"""A KCoral server whose JSON answer is nested deeper than the parser goes (a few hundred
KiB of ``[``) is that server's problem, never a 500 for every server of the panel.

Python's JSON decoder raises ``RecursionError`` (not a ``ValueError``) for such a body. A
real Jupyter server with the extension; the deep server is a stand-in Tornado app on
loopback beside a healthy one."""

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


class Answering(tornado.web.RequestHandler):
    """``deep``: every answer is DEEP; else a healthy server with one running job."""

    def initialize(self, deep: bool) -> None:
        self.deep = deep

    def answer(self, document: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(DEEP if self.deep else json.dumps(document))

    def get(self, path: str) -> None:
        if path == "health":
            return self.answer(HEALTH)
        if path == "v1/info":
            return self.answer(INFO)
        if path == "v1/jobs":
            return self.answer([{"job_id": "fine", "status": "RUNNING"}])
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
                    lambda deep=deep: tornado.web.Application(
                        [(r"/(.*)", Answering, {"deep": deep})]
                    )
                )
            )
            for name, deep in (("deep", True), ("healthy", False))
        }


@pytest.fixture
def jp_server_config(urls: dict[str, str]) -> Config:
    return extension_config([{"name": name, "url": url} for name, url in urls.items()])


async def test_a_server_answering_json_nested_too_deep_leaves_the_other_servers_listed(jp_fetch):
    response = await jp_fetch("kcoral", "api", "servers")
    assert response.code == 200
    servers = {entry["name"]: entry for entry in json.loads(response.body)["servers"]}
    assert servers["deep"]["error"]
    assert "error" not in servers["healthy"]


async def test_a_server_answering_json_nested_too_deep_leaves_the_other_servers_jobs_listed(
    jp_fetch,
):
    response = await jp_fetch("kcoral", "api", "jobs")
    assert response.code == 200
    listed = json.loads(response.body)
    assert [(job["job_id"], job["server"]) for job in listed["jobs"]] == [("fine", "healthy")]
    assert [error["server"] for error in listed["errors"]] == ["deep"]
