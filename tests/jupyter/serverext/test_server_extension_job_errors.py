"""``GET kcoral/api/jobs/{id}/error``: why a finished job failed, for the KCoral panel (its
live output never says it: a soak found the panel's pane saying only `finished: failed`).
The Jupyter server extension against a real CPU KCoral server."""

from __future__ import annotations

import json

import pytest
import tornado.httpclient
from traitlets.config import Config

import kcoral

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def jp_server_config(cpu_server_url: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {"servers": [{"name": "cpu", "url": cpu_server_url}]},
        }
    )


def _finished_job(url: str, body: str) -> str:
    program = kcoral.Program()
    module = program.upload(kind="module", source=f"def f():\n    {body}\n")
    program.return_(key="x", value=program.run(fn=program.get_function(module=module, name="f")))
    with kcoral.Client(url) as client:
        job = client.submit(program)
        job.wait(60)
        return job.id


async def test_a_failed_jobs_error_is_its_kind_and_message_and_nothing_else(
    jp_fetch, cpu_server_url
) -> None:
    job_id = _finished_job(cpu_server_url, "print('x' * 1000)\n    raise ValueError('boom 3')")
    answer = json.loads((await jp_fetch("kcoral", "api", "jobs", job_id, "error")).body)
    assert answer == {"kind": "runtime", "message": "ValueError: boom 3"}


async def test_a_job_without_an_error_is_404_no_error(jp_fetch, cpu_server_url) -> None:
    job_id = _finished_job(cpu_server_url, "return 1")
    with pytest.raises(tornado.httpclient.HTTPClientError) as info:
        await jp_fetch("kcoral", "api", "jobs", job_id, "error")
    assert info.value.code == 404
    assert json.loads(info.value.response.body)["error"]["kind"] == "no_error"


async def test_an_unknown_jobs_error_is_404(jp_fetch) -> None:
    with pytest.raises(tornado.httpclient.HTTPClientError) as info:
        await jp_fetch("kcoral", "api", "jobs", "no-such-job", "error")
    assert info.value.code == 404
