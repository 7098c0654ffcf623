"""The Jupyter server extension's REST API against a real KCoral server."""

from __future__ import annotations

import datetime
import json

import pytest
import tornado.httpclient
from jupyter_login import login_cookies
from traitlets.config import Config

from kcoral import Client

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def jp_server_config(cpu_server_url: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {
                "servers": [
                    {"name": "cpu", "url": cpu_server_url, "token": "server-side-secret"},
                    {"name": "gone", "url": "http://127.0.0.1:9"},
                ]
            },
        }
    )


async def test_servers_lists_health_and_info_and_keeps_tokens_server_side(
    jp_fetch, cpu_server_url
) -> None:
    response = await jp_fetch("kcoral", "api", "servers")
    assert response.code == 200
    body = response.body.decode()
    assert "server-side-secret" not in body
    servers = {s["name"]: s for s in json.loads(body)["servers"]}
    assert servers["cpu"]["url"] == cpu_server_url
    assert servers["cpu"]["health"]["status"] == "ok"
    assert servers["cpu"]["info"]["device"] == "cpu"
    assert servers["cpu"]["auth"] is True
    assert servers["gone"]["reachable"] is False and servers["gone"]["error"]


async def test_jobs_reports_servers_without_the_jobs_api(jp_fetch, cpu_server_url) -> None:
    response = await jp_fetch("kcoral", "api", "jobs")
    document = json.loads(response.body)
    assert isinstance(document["jobs"], list)
    names = {e["server"] for e in document["errors"]}
    assert "gone" in names
    if "jobs" not in (Client(cpu_server_url).info().get("features") or []):
        assert "cpu" in names


async def test_an_unknown_job_is_404(jp_fetch) -> None:
    for method in ("GET", "DELETE"):
        with pytest.raises(tornado.httpclient.HTTPClientError) as info:
            await jp_fetch("kcoral", "api", "jobs", "no-such-job", method=method)
        assert info.value.code == 404
    with pytest.raises(tornado.httpclient.HTTPClientError) as info:
        await jp_fetch("kcoral", "api", "jobs", "no-such-job", "events")
    assert info.value.code == 404


async def test_a_submitted_job_is_visible_and_its_events_are_proxied(
    jp_fetch, cpu_server_url
) -> None:
    import kcoral

    client = Client(cpu_server_url)
    if "jobs" not in (client.info().get("features") or []) or not hasattr(client, "submit"):
        pytest.skip("the server or client has no jobs API yet")
    program = kcoral.Program()
    module = program.upload(kind="module", source="def f():\n    print('hi')\n    return 1\n")
    program.return_(key="x", value=program.run(fn=program.get_function(module=module, name="f")))
    job = client.submit(program)
    job.result()
    state = json.loads((await jp_fetch("kcoral", "api", "jobs", job.id)).body)
    assert state["job_id"] == job.id and state["server"] == "cpu"
    listed = json.loads((await jp_fetch("kcoral", "api", "jobs")).body)["jobs"]
    assert job.id in [j["job_id"] for j in listed]
    # The server's clock when it answered (its Date header, whole seconds), for the panel
    # to count a running job's time on: no earlier than the second the job finished in.
    [record] = [j for j in listed if j["job_id"] == job.id]
    finished = datetime.datetime.fromisoformat(record["finished_at"].replace("Z", "+00:00"))
    assert int(finished.timestamp()) <= record["observed_at"] < finished.timestamp() + 120
    events = await jp_fetch("kcoral", "api", "jobs", job.id, "events")
    assert events.headers["Content-Type"].startswith("text/event-stream")
    assert b"hi" in events.body and b"finished" in events.body


async def test_an_unauthenticated_request_is_refused(http_server_client, jp_base_url) -> None:
    for path in ("servers", "jobs", "jobs/x"):
        with pytest.raises(tornado.httpclient.HTTPClientError) as info:
            await http_server_client.fetch(f"{jp_base_url}kcoral/api/{path}")
        assert info.value.code == 403


async def test_a_cross_site_request_is_refused(
    http_server_client, jp_base_url, jp_auth_header
) -> None:
    # A browser session (the login cookie), but from another site's page: Jupyter refuses
    # cross-origin API calls and state changes without the XSRF token, so a page elsewhere
    # cannot read the servers or cancel jobs with the user's cookie.
    cookies = await login_cookies(http_server_client, jp_base_url, jp_auth_header)
    same_site = await http_server_client.fetch(
        f"{jp_base_url}kcoral/api/servers", headers={"Cookie": cookies}, raise_error=False
    )
    assert same_site.code == 200  # the cookie alone is a valid session
    for method, path in (("GET", "servers"), ("DELETE", "jobs/x")):
        answer = await http_server_client.fetch(
            f"{jp_base_url}kcoral/api/{path}",
            method=method,
            headers={"Cookie": cookies, "Origin": "http://evil.example"},
            raise_error=False,
        )
        assert answer.code in (403, 404), (method, path, answer.code)
