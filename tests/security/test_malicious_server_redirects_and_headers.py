"""A malicious server (or whatever answers on the URL the user gave: a URL in a shared
notebook, a hijacked name) against the client's HTTP: redirects that would carry the token
elsewhere, cookies, floods of headers, lying lengths and answers that never end.

Attacker: the server. It may send any bytes. Whatever it sends, the client never follows
a redirect (the user's ``Authorization`` and program reach only the URL the user named),
never stores or returns a cookie, and ends each call with ``KCoralError`` (an answer),
``TransportError`` (a broken one) or ``ProtocolError`` (a malformed one, CLIENT_API §9),
never a hang past its read timeout nor a traceback from inside the HTTP library.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest
from stand_in_http import StandIn, serving
from test_malicious_server_transport import answering, head

from kcoral import AsyncClient, Client, Program, base_client
from kcoral.cli import main as kcoral_main
from kcoral.connection import http as client_http
from kcoral.errors import KCoralError, TransportError

pytestmark = pytest.mark.timeout(120)

TOKEN = "the-users-own-token"
HEALTH = (
    b'{"status": "ok", "instance_id": "i", "started_at": "2026-12-01T00:00:00.000000Z", '
    b'"gpu_count": 0, "load": {"request_capacity": 1, "requests_in_progress": 0, '
    b'"requests_waiting": 0}, "target": {}, "versions": {}}'
)


class Elsewhere(StandIn):
    """The address a redirect points at: records every request that reaches it."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[str]] = []
    lock = threading.Lock()

    def _record(self) -> None:
        with self.lock:
            self.seen.append(f"{self.command} {self.path} {self.headers.get('Authorization')}")
        self.send_json({"status": "ok"})

    do_GET = do_POST = do_DELETE = _record


@pytest.fixture
def elsewhere() -> Iterator[str]:
    Elsewhere.seen = []
    with serving(Elsewhere) as url:
        # another host name for the same loopback listener: a browser's "other host"
        yield url.replace("127.0.0.1", "localhost")


def program() -> Program:
    built = Program()
    built.return_(key="k", value=built.upload(kind="bytes", value=b"k", id="k"))
    return built


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_never_followed_and_the_token_never_leaves(
    elsewhere: str, status: int
) -> None:
    def redirect(method: str, path: str) -> list[bytes]:
        return [
            head(
                status, Location=f"{elsewhere}{path}?stolen=1", Content_Length=0, Connection="close"
            )
        ]

    with answering(redirect) as url, Client(url, token=TOKEN) as client:
        calls = (client.health, client.info, lambda: client.execute(program()))
        for call in calls:
            with pytest.raises(KCoralError) as caught:
                call()
            assert caught.value.status_code == status
            # the user is told where it pointed and why it was not followed; the path and
            # query the server chose are not repeated
            assert str(caught.value).startswith(
                f"the server answered {status}, a redirect to {elsewhere}, which KCoral "
                "never follows"
            ), str(caught.value)
            assert "stolen" not in str(caught.value)
    assert Elsewhere.seen == []


def test_an_async_client_never_follows_a_redirect_either(elsewhere: str) -> None:
    def redirect(method: str, path: str) -> list[bytes]:
        return [head(307, Location=f"{elsewhere}{path}", Content_Length=0, Connection="close")]

    async def calls() -> None:
        async with AsyncClient(url, token=TOKEN) as client:
            with pytest.raises(KCoralError, match="a redirect to"):
                await client.health()
            with pytest.raises(KCoralError, match="a redirect to"):
                await client.execute(program())

    with answering(redirect) as url:
        asyncio.run(calls())
    assert Elsewhere.seen == []


@pytest.mark.parametrize(
    "location",
    [
        "http://evil.example\x1b]52;c;ZWNobyBoaQ==\x07/",
        "\x1b[2J/clear",
        "\x9b2J",
        "",
        "http://[::1",
    ],
)
def test_a_redirect_names_no_address_that_a_terminal_would_act_on(location: str) -> None:
    def redirect(method: str, path: str) -> list[bytes]:
        answer = f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
        return [answer.encode("latin-1")]

    with answering(redirect) as url, Client(url) as client:
        with pytest.raises(KCoralError) as caught:
            client.health()
    shown = str(caught.value)
    assert not any(c in shown for c in "\x1b\x07\x9b"), shown
    assert "evil.example" not in shown and "a redirect to " in shown


def test_a_redirect_to_a_path_on_the_same_server_names_the_path() -> None:
    def redirect(method: str, path: str) -> list[bytes]:
        return [head(302, Location="/login?next=/health", Content_Length=0)]

    with answering(redirect) as url, Client(url) as client:
        with pytest.raises(KCoralError, match="a redirect to /login on the same server"):
            client.health()


class CookieSetter(StandIn):
    """A healthy-looking server that sets a cookie on every answer and records the
    ``Cookie`` header of every request."""

    protocol_version = "HTTP/1.1"
    cookies: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).cookies.append(self.headers.get("Cookie"))
        self.send_response(200)
        self.send_header("Set-Cookie", "tracker=1; Path=/; Max-Age=3600")
        self.send_header("Set-Cookie", "session=planted; Domain=127.0.0.1; Path=/")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(HEALTH)))
        self.end_headers()
        self.wfile.write(HEALTH)


def test_a_cookie_the_server_sets_is_never_sent_back() -> None:
    CookieSetter.cookies = []
    with serving(CookieSetter) as url, Client(url, token=TOKEN) as client:
        for _ in range(3):
            assert client.health()["status"] == "ok"
    assert CookieSetter.cookies == [None, None, None]


def many_headers(method: str, path: str) -> list[bytes]:
    lines = b"".join(b"X-Flood-%d: y\r\n" % i for i in range(5000))
    return [b"HTTP/1.1 200 OK\r\n" + lines + b"Content-Length: 2\r\n\r\n{}"]


def one_long_header(method: str, path: str) -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\nX-Flood: " + b"a" * (4 << 20) + b"\r\nContent-Length: 2\r\n\r\n{}"]


def two_lengths(method: str, path: str) -> list[bytes]:
    return [head(200, Content_Type="application/json", Content_Length="2, 50") + b"{}"]


def length_then_close(method: str, path: str) -> list[bytes]:
    return [head(200, Content_Type="application/json", Content_Length=5000) + b"{}"]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (many_headers, "its answer was refused: more than 100 headers"),
        (one_long_header, "its answer was refused: a header line over 64 KiB"),
        (two_lengths, "its answer was refused: conflicting Content-Length values"),
        (length_then_close, "the connection closed in the middle of the answer (2 of 5000"),
    ],
)
def test_flooded_headers_and_lying_lengths_are_a_transport_error_saying_the_server_answered(
    answer, said: str
) -> None:
    # the server was reached: "cannot reach URL: got more than 100 headers" was untrue
    with answering(answer) as url, Client(url, token=TOKEN) as client:
        for call in (client.health, lambda: client.execute(program())):
            with pytest.raises(TransportError) as caught:
                call()
            assert str(caught.value).startswith(f"{url} answered, but {said}"), caught.value


def test_an_answer_that_stops_after_its_head_ends_at_the_read_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # slowloris from the server's side: a head, one byte, then silence with the socket open
    monkeypatch.setattr(base_client, "STATUS_READ_TIMEOUT_SECONDS", 1.0)
    stop = threading.Event()

    def stalled(method: str, path: str) -> Iterator[bytes]:
        yield head(200, Content_Type="application/json", Content_Length=500) + b"{"
        stop.wait(60)

    with answering(stalled) as url, Client(url) as client:
        try:
            with pytest.raises(TransportError, match="answered, but its answer did not end"):
                client.health()
        finally:
            stop.set()


def trickling_head(stop: threading.Event, status_line: str):
    """An answer whose head never ends: after its status line (sent at once, or a byte
    every 0.1 s, or never) a header's value comes a byte every 0.1 s until ``stop``."""

    def answer(method: str, path: str) -> Iterator[bytes]:
        if status_line == "at once":
            yield b"HTTP/1.1 200 OK\r\nX-Slow: "
        elif status_line == "a byte at a time":
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: ":
                yield bytes([byte])
                if stop.wait(0.1):
                    return
        while not stop.wait(0.1):
            if status_line != "never":
                yield b"a"

    return answer


@pytest.mark.parametrize(
    ("status_line", "said"),
    [
        ("at once", "{url} answered, but its answer's head did not come within 3.0 s"),
        ("a byte at a time", "{url} answered, but its answer's head did not come within 3.0 s"),
        ("never", "cannot reach {url}: no answer within 3.0 s (read timeout)"),
    ],
    ids=("status line at once", "status line a byte at a time", "nothing at all"),
)
def test_a_status_answer_whose_head_trickles_says_it_answered_but_its_head_came_too_slowly(
    monkeypatch: pytest.MonkeyPatch, status_line: str, said: str
) -> None:
    # the server took the connection and sent bytes: "cannot reach URL: no answer within
    # 30 s (read timeout)" was untrue; only a server that sent nothing says it
    # 3 s: its first bytes come at once, even to a client on a loaded machine
    monkeypatch.setattr(base_client, "STATUS_READ_TIMEOUT_SECONDS", 3.0)
    stop = threading.Event()
    try:
        with answering(trickling_head(stop, status_line)) as url, Client(url) as client:
            with pytest.raises(TransportError) as caught:
                client.health()
        assert str(caught.value) == said.format(url=url)
        assert (caught.value.answered_but is None) == (status_line == "never")
    finally:
        stop.set()


def test_kcoral_run_says_where_a_redirect_pointed_and_that_it_was_not_followed(
    elsewhere: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def redirect(method: str, path: str) -> list[bytes]:
        return [head(308, Location=f"{elsewhere}{path}", Content_Length=0, Connection="close")]

    with answering(redirect) as url:
        assert kcoral_main(["run", "shell", "--url", url, "--", "true"]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1].startswith(
        f"kcoral run: {url}: the server answered 308, a redirect to {elsewhere}, which KCoral "
        "never follows"
    ), said
    assert Elsewhere.seen == []


def trickling(stop: threading.Event, **length: object):
    """An answer whose head comes at once and whose body comes a byte at a time, every
    0.1 s, until ``stop`` (for ever, as far as the client can tell): chunked, as a
    keep-alive of spaces, or with a ``Content-Length`` it never reaches."""

    def answer(method: str, path: str) -> Iterator[bytes]:
        if length:
            yield head(200, Content_Type="application/json", **length) + b"{"
        else:
            yield head(200, Content_Type="application/json", Transfer_Encoding="chunked")
        while not stop.wait(0.1):
            yield b" " if length else b"1\r\n \r\n"

    return answer


@pytest.mark.parametrize("length", [{}, {"Content_Length": 10**6}])
def test_a_status_answer_that_trickles_ends_at_its_deadline_for_the_whole_answer(
    monkeypatch: pytest.MonkeyPatch, length: dict[str, object]
) -> None:
    # each read came within its timeout: health() waited as long as the server trickled
    monkeypatch.setattr(base_client, "STATUS_READ_TIMEOUT_SECONDS", 1.0)
    stop = threading.Event()

    async def async_health(url: str) -> None:
        async with AsyncClient(url) as client:
            await client.health()

    try:
        with answering(trickling(stop, **length)) as url, Client(url) as client:
            calls = (
                client.health,
                client.info,
                client.jobs,
                lambda: asyncio.run(async_health(url)),
            )
            for call in calls:
                with pytest.raises(TransportError) as caught:
                    call()
                assert str(caught.value) == (
                    f"{url} answered, but its answer did not end within 1.0 s"
                )
    finally:
        stop.set()


@pytest.mark.parametrize("length", [{}, {"Content_Length": 100}])
def test_a_program_answer_that_trickles_ends_once_under_the_floor(
    monkeypatch: pytest.MonkeyPatch, length: dict[str, object]
) -> None:
    # a program's answer has no read timeout at all (its run is the server's to bound): a
    # body sent a byte at a time held execute() for ever
    monkeypatch.setattr(client_http, "BODY_GRACE_SECONDS", 1.0)
    stop = threading.Event()
    try:
        with answering(trickling(stop, **length)) as url, Client(url) as client:
            with pytest.raises(TransportError) as caught:
                client.execute(program())
        assert str(caught.value) == (
            f"{url} answered, but its answer came too slowly: its body has 1 s plus 1 s per 64 KiB"
        )
    finally:
        stop.set()
