"""What the panel is told about a server it cannot ask (issue 29.4): one line in words,
for a server that is not running, a host name that does not resolve, a server that never
answers and one that wants a token, each against the real thing on loopback; and a label
a person recognises for each server."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import pytest
from server_process import running_server
from stand_in_http import silent
from traitlets.config import Config

pytestmark = pytest.mark.timeout(180)

TOKEN = "problems-server-token"


@pytest.fixture(scope="module")
def locked_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real CPU server that requires TOKEN."""
    with running_server(
        tmp_path_factory.mktemp("locked-server"),
        ["--log-dir", ""],
        env={"KCORAL_AUTH_TOKEN": TOKEN},
    ) as server:
        yield server.url


@pytest.fixture(scope="module")
def silent_url() -> Iterator[str]:
    """A listener that accepts connections and never says a word."""
    with silent() as url:
        yield url


def _refused_port() -> int:
    with socket.socket() as probe:  # bound and closed: nothing listens there now
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


REFUSED_PORT = _refused_port()


@pytest.fixture
def jp_server_config(locked_server_url: str, silent_url: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {
                "request_timeout": 2.0,
                "servers": [
                    {"name": "gpu box", "url": locked_server_url, "token": TOKEN},
                    {"name": "no token", "url": locked_server_url},
                    {"name": "wrong token", "url": locked_server_url, "token": "not-it"},
                    {"name": "stopped", "url": f"http://127.0.0.1:{REFUSED_PORT}"},
                    {"name": "nowhere", "url": "http://kcoral-no-such-host.invalid:8000"},
                    {"name": "silent", "url": silent_url},
                ],
            },
        }
    )


async def _servers(jp_fetch) -> dict[str, dict]:
    document = json.loads((await jp_fetch("kcoral", "api", "servers")).body)
    return {entry["name"]: entry for entry in document["servers"]}


async def test_each_server_that_cannot_be_asked_is_described_in_one_line_of_words(
    jp_fetch, silent_url
) -> None:
    servers = await _servers(jp_fetch)
    assert servers["gpu box"]["health"]["status"] == "ok" and "error" not in servers["gpu box"]
    errors = {name: entry.get("error") for name, entry in servers.items() if name != "gpu box"}
    assert errors == {
        "no token": "needs a token: set one for this server (HTTP 401)",
        "wrong token": "refused the token configured for it (HTTP 401)",
        "stopped": f"not running: nothing answers at 127.0.0.1:{REFUSED_PORT}",
        "nowhere": "unknown host: the name kcoral-no-such-host.invalid does not resolve",
        "silent": f"no answer from {silent_url.removeprefix('http://')} within 2 s",
    }
    for text in errors.values():  # no exception names, no errno, one line
        assert "Error" not in text and "Errno" not in text and "\n" not in text


async def test_the_jobs_notes_name_the_problem_in_the_same_words(jp_fetch) -> None:
    document = json.loads((await jp_fetch("kcoral", "api", "jobs")).body)
    notes = {e["server"]: e["message"] for e in document["errors"]}
    assert notes["stopped"] == f"not running: nothing answers at 127.0.0.1:{REFUSED_PORT}"
    assert notes["no token"] == "needs a token: set one for this server (HTTP 401)"


async def test_a_configured_server_is_labelled_with_its_configured_name(jp_fetch) -> None:
    servers = await _servers(jp_fetch)
    assert servers["gpu box"]["label"] == "gpu box"
    assert servers["gpu box"]["notebooks"] == []


async def test_a_job_or_session_on_a_server_that_cannot_be_asked_says_why_not_that_none_knows_it(
    jp_fetch,
) -> None:
    # A soak of the panel: the user follows (or cancels) a job, or stops a session, on a
    # server that has just stopped. Every such call named that server (?server=) and was
    # answered 404 "no KCoral server knows job 54b98211-…", which is untrue (the server that
    # knows it cannot be asked) and ended the panel's live output for good (a 4xx is final),
    # even when the server came back seconds later. It is a 502 saying why the server
    # cannot be asked, which the panel shows and its live output retries.
    job = "54b98211-c6c2-47c0-8e70-bd6b93686143"
    calls = [
        ("GET", ("jobs", job)),
        ("DELETE", ("jobs", job)),
        ("GET", ("jobs", job, "events")),
        ("GET", ("sessions", job)),
        ("DELETE", ("sessions", job)),
    ]
    expected = f"not running: nothing answers at 127.0.0.1:{REFUSED_PORT}"
    for method, path in calls:
        answer = await jp_fetch(
            "kcoral", "api", *path, method=method, params={"server": "stopped"}, raise_error=False
        )
        document = json.loads(answer.body)
        said = document.get("message") or document.get("error", {}).get("message")
        assert (answer.code, said) == (502, expected), (method, path)


async def test_a_server_that_never_answers_does_not_make_the_others_look_down(jp_fetch) -> None:
    # A soak: a KCoral server stopped with SIGSTOP accepts connections and never answers.
    # Each panel's poll held a few calls to it for the request timeout, and all calls to all
    # servers shared one client of 10 connections: with a few panels open, the calls to the
    # healthy servers waited in its queue until they timed out, and the panel showed them
    # as 'no answer ... within 10 s' (the status bar: offline). Each server has its own
    # connections now. Here 30 panels ask at once; every answer shows "gpu box" healthy.
    answers = await asyncio.gather(*(_servers(jp_fetch) for _ in range(30)))
    healthy = [servers["gpu box"].get("error") for servers in answers]
    assert healthy == [None] * 30
    assert all(servers["silent"]["error"].startswith("no answer from") for servers in answers)
