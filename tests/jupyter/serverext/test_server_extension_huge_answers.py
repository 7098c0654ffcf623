"""A KCoral server that answers the panel's polls with more than the extension reads (16 MiB)
is that server's problem: its card says so and the Jupyter server keeps no more of it,
while every other server is listed as before.

Before, each answer was read whole (up to Tornado's 100 MB) and decoded: a rogue server
polled every few seconds held hundreds of MB of the Jupyter server's memory. A real Jupyter
server with the extension; the servers are stand-in Tornado apps on loopback."""

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
#: valid answers, each a little over the 16 MiB the extension reads
PADDING = "x" * (17 << 20)
TOO_MANY_JOBS = [{"job_id": f"j{i}", "status": "RUNNING"} for i in range(400_000)]


class Answering(tornado.web.RequestHandler):
    """``huge``: well-formed answers over 16 MiB; else a healthy server with one job."""

    def initialize(self, huge: bool) -> None:
        self.huge = huge

    def answer(self, document: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(document))

    def get(self, path: str) -> None:
        if path == "health":
            return self.answer({**HEALTH, "padding": PADDING} if self.huge else HEALTH)
        if path == "v1/info":
            return self.answer(INFO)
        if path == "v1/jobs":
            jobs = TOO_MANY_JOBS if self.huge else [{"job_id": "fine", "status": "RUNNING"}]
            return self.answer(jobs)
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
                    lambda huge=huge: tornado.web.Application(
                        [(r"/(.*)", Answering, {"huge": huge})]
                    )
                )
            )
            for name, huge in (("huge", True), ("healthy", False))
        }


@pytest.fixture
def jp_server_config(urls: dict[str, str]) -> Config:
    return extension_config([{"name": name, "url": url} for name, url in urls.items()])


async def test_a_server_answering_more_than_the_panel_reads_is_said_to_and_others_are_listed(
    jp_fetch,
):
    response = await jp_fetch("kcoral", "api", "servers")
    assert response.code == 200
    servers = {entry["name"]: entry for entry in json.loads(response.body)["servers"]}
    assert "answered more than 16 MiB" in servers["huge"]["error"]
    assert "error" not in servers["healthy"]


async def test_a_job_list_over_the_bound_is_that_servers_error_not_a_list_of_400000_jobs(
    jp_fetch,
):
    response = await jp_fetch("kcoral", "api", "jobs")
    assert response.code == 200
    listed = json.loads(response.body)
    assert [(job["job_id"], job["server"]) for job in listed["jobs"]] == [("fine", "healthy")]
    assert [error["server"] for error in listed["errors"]] == ["huge"]
    assert "answered more than 16 MiB" in listed["errors"][0]["message"]
