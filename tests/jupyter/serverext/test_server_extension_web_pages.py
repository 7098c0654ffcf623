"""A web page the user visits against the server extension's routes (EXTENSIONS §6's
first attacker, here in front of Jupyter): the browser holds the user's Jupyter login
cookie, and the page makes it send that cookie along, from its own origin, from a
``file:`` page or sandboxed frame (``Origin: null``), or under its own rebound name
(``Host: rebind.example``). Each route acts with the KCoral tokens configured here, so a
page that got through could cancel the user's jobs or read their live output. The upstream
KCoral server below records every call the extension makes: none may reach it."""

from __future__ import annotations

import pytest
from jupyter_login import login_cookies
from stand_in_http import serving
from stand_in_kcoral import RecordingKCoralServer
from traitlets.config import Config

pytestmark = pytest.mark.timeout(120)

JOB = "job-of-the-user"
#: every route a page could aim at, with a method it answers
ROUTES = [
    ("GET", "servers"),
    ("GET", "jobs"),
    ("GET", f"jobs/{JOB}"),
    ("DELETE", f"jobs/{JOB}"),
    ("GET", f"jobs/{JOB}/events"),
    ("GET", f"jobs/{JOB}/error"),
    ("GET", "sessions"),
    ("DELETE", "sessions/s1"),
]


@pytest.fixture(scope="module")
def upstream_url():
    with serving(RecordingKCoralServer) as url:
        yield url


@pytest.fixture
def jp_server_config(upstream_url: str) -> Config:
    return Config(
        {
            "ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}},
            "KCoralExtension": {"servers": [{"name": "mine", "url": upstream_url}]},
        }
    )


@pytest.fixture
def as_the_users_browser(http_server_client, jp_base_url, jp_auth_header):
    """Sends each ``(method, route)`` with the user's login cookie and ``headers``, as the
    browser would for a page; answers ``{"METHOD route": status}``. The recorder starts
    empty."""

    async def send(routes: list[tuple[str, str]], headers: dict[str, str]) -> dict[str, int]:
        cookies = await login_cookies(http_server_client, jp_base_url, jp_auth_header)
        RecordingKCoralServer.calls.clear()
        answers = {}
        for method, route in routes:
            answer = await http_server_client.fetch(
                f"{jp_base_url}kcoral/api/{route}",
                method=method,
                body=b"program" if method == "POST" else None,
                headers={"Cookie": cookies, **headers},
                raise_error=False,
                follow_redirects=False,
                allow_nonstandard_methods=True,
            )
            # a page that could read the answer would see the user's jobs: no CORS grant
            assert answer.headers.get("Access-Control-Allow-Origin") is None
            answers[f"{method} {route}"] = answer.code
        return answers

    return send


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "file://"])
async def test_a_page_of_another_origin_with_the_users_cookie_reaches_no_kcoral_server(
    as_the_users_browser, origin: str
) -> None:
    answers = await as_the_users_browser(ROUTES, {"Origin": origin})
    assert set(answers.values()) <= {403, 404}, answers
    assert RecordingKCoralServer.calls == []


async def test_a_text_plain_post_with_the_users_cookie_reaches_no_kcoral_server(
    as_the_users_browser,
) -> None:
    # the one body a page sends without a preflight, and without the XSRF token
    posts = [("POST", route) for route in ("jobs", f"jobs/{JOB}", "sessions")]
    answers = await as_the_users_browser(posts, {"Content-Type": "text/plain"})
    assert set(answers.values()) <= {403, 405}, answers
    assert RecordingKCoralServer.calls == []


async def test_a_rebound_page_with_the_users_cookie_reaches_no_kcoral_server(
    as_the_users_browser, jp_http_port
) -> None:
    answers = await as_the_users_browser(ROUTES, {"Host": f"rebind.example:{jp_http_port}"})
    assert set(answers.values()) == {403}, answers
    assert RecordingKCoralServer.calls == []


@pytest.mark.parametrize(
    ("site", "mode", "destination"),
    [
        ("same-site", "no-cors", "script"),  # another port's page: the cookie goes along
        ("same-site", "no-cors", "image"),
        ("cross-site", "navigate", "document"),  # any page moving a tab: the cookie goes
    ],
)
async def test_a_page_loading_a_route_as_a_script_image_or_tab_reaches_no_kcoral_server(
    as_the_users_browser, site: str, mode: str, destination: str
) -> None:
    # What Chromium sends for <script src>, <img src> and a navigation: no Origin at all.
    headers = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": destination}
    answers = await as_the_users_browser([r for r in ROUTES if r[0] == "GET"], headers)
    assert set(answers.values()) == {403}, answers
    assert RecordingKCoralServer.calls == []


async def test_the_users_own_page_still_reaches_the_kcoral_server(
    as_the_users_browser, jp_http_port
) -> None:
    # the counter-proof: the same cookie from Jupyter's own origin is served
    own = f"127.0.0.1:{jp_http_port}"
    answers = await as_the_users_browser(
        [("GET", f"jobs/{JOB}")],
        {"Origin": f"http://{own}", "Host": own, "Sec-Fetch-Site": "same-origin"},
    )
    assert answers == {f"GET jobs/{JOB}": 404}  # the upstream's own "no such job"
    assert RecordingKCoralServer.calls == [f"GET /v1/jobs/{JOB}"]
