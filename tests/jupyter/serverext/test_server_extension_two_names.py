"""One KCoral server configured under two names (two spellings of its address, as a
configured URL and a kernel's record can give): both answer for its jobs, with the same
record, and that is no contest (``find`` asks every server and refuses only claims that
disagree, tests in test_server_extension_claims.py). A real Jupyter server with the
extension; the KCoral server is a stand-in Tornado app on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import tornado.web
from stand_in_http import serving_app
from stand_in_kcoral import extension_config
from traitlets.config import Config

pytestmark = pytest.mark.timeout(180)


class Real(tornado.web.RequestHandler):
    def get(self, path: str) -> None:
        self.set_header("Content-Type", "application/json")
        if path == "v1/jobs/known":
            return self.finish(
                json.dumps({"job_id": "known", "request_id": "r1", "status": "RUNNING"})
            )
        self.set_status(404)
        self.finish(json.dumps({"error": {"kind": "not_found", "message": "no such job"}}))


@pytest.fixture(scope="module")
def real_url() -> Iterator[str]:
    with serving_app(lambda: tornado.web.Application([(r"/(.*)", Real)])) as url:
        yield url


@pytest.fixture
def jp_server_config(real_url: str) -> Config:
    servers = [
        {"name": "gpu", "url": real_url},
        {"name": "gpu-by-name", "url": real_url.replace("127.0.0.1", "localhost")},
    ]
    return extension_config(servers)


async def test_one_server_under_two_names_answers_for_its_job_without_a_409(jp_fetch) -> None:
    shown = await jp_fetch("kcoral", "api", "jobs", "known")
    record = json.loads(shown.body)
    assert record["request_id"] == "r1" and record["server"] == "gpu"
