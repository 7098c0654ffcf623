"""A server that answers, but with an answer the client refuses (too many headers, lying
lengths, no HTTP at all, cut short) or a redirect, as a notebook says it. The client's own
line says ``URL answered, but ...``; the notebook said ``no answer from URL: got more than
100 headers`` and told the user to start a server there, and a redirect read ``answered HTTP
307 without a KCoral error``. Real sockets answer; the notebook's lines are the user's."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from kcoral_jupyter.cell_errors import (
    NOT_KCORAL_HINT,
    TOO_LARGE_HINT,
    AnswerRefusedError,
    ServerRefusedError,
    ServerUnreachableError,
    shorten,
)
from kcoral_jupyter.notebook_session import session_unreachable
from kcoral_shell import kcoral_shell

from kcoral import Client, TransportError, base_client

ANSWERS = {
    "more than 100 headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-%d: a\r\n" % i for i in range(150))
    + b"Content-Length: 2\r\n\r\n{}",
    "conflicting Content-Length values": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}",
    "the answer is not HTTP": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "the connection closed in the middle of the answer (2 of 100 bytes came)": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{}"
    ),
}
REDIRECT = (
    b"HTTP/1.1 307 Temporary Redirect\r\nLocation: https://elsewhere.example:8443/v1\r\n"
    b"Content-Length: 0\r\n\r\n"
)


@contextmanager
def answering(answer: bytes, *, trickling: bool = False) -> Iterator[str]:
    """A server that answers each request ``answer``; ``trickling``: then a byte every
    0.1 s, for as long as the client listens."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                peer, _ = listener.accept()
            except OSError:
                return
            with peer, contextlib.suppress(OSError):  # the client hung up
                peer.recv(65536)
                peer.sendall(answer)
                while trickling:
                    time.sleep(0.1)
                    peer.sendall(b"a")

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_an_answer_over_what_the_client_reads_says_what_to_do_not_that_it_is_no_kcoral_server():
    """An answer over ``max_answer_bytes`` (EXTENSIONS §17) may be a KCoral server's honest
    one: the cell asked "is it a KCoral server (or a proxy in front of one)?" of it."""
    large = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n\r\n"
    with answering(large) as url:
        with pytest.raises(TransportError) as failed:
            Client(url, max_answer_bytes=1 << 20).health()
        shown = shorten(failed.value, url)
    assert isinstance(shown, AnswerRefusedError)
    assert str(shown).startswith(f"{url} answered, but its answer is 4.8 MiB, more than the ")
    assert shown.action == TOO_LARGE_HINT


@pytest.mark.parametrize("trouble", list(ANSWERS))
def test_a_refused_answer_reads_answered_but_not_no_answer(trouble: str) -> None:
    with answering(ANSWERS[trouble]) as url:
        with pytest.raises(Exception) as failed:
            Client(url).health()
        shown = shorten(failed.value, url)
        assert isinstance(shown, AnswerRefusedError)
        assert isinstance(shown, ServerUnreachableError)  # what callers caught keeps working
        assert shown.cause.startswith(f"{url} answered, but ")
        assert trouble in shown.cause
        assert "no answer" not in shown.cause
        assert shown.action == NOT_KCORAL_HINT  # not "start the server there"


def test_a_head_that_trickles_reads_answered_but_its_head_did_not_come_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # it said "no answer from URL: no answer within 30 s (read timeout)" and to start a
    # server there, though the server took the request and kept sending
    # 3 s: its first bytes come at once, even to a client on a loaded machine
    monkeypatch.setattr(base_client, "STATUS_READ_TIMEOUT_SECONDS", 3.0)
    with answering(b"HTTP/1.1 200 OK\r\nX-Slow: ", trickling=True) as url:
        with pytest.raises(Exception) as failed:
            Client(url).health()
        shown = shorten(failed.value, url)
        assert isinstance(shown, AnswerRefusedError)
        assert shown.cause == f"{url} answered, but its answer's head did not come within 3.0 s"


def test_a_redirect_says_where_it_pointed_and_that_it_is_never_followed() -> None:
    with answering(REDIRECT) as url:
        with pytest.raises(Exception) as failed:
            Client(url).health()
        shown = shorten(failed.value, url)
        assert isinstance(shown, ServerRefusedError) and shown.status_code == 307
        assert shown.cause == (
            f"{url} answered HTTP 307, a redirect to https://elsewhere.example:8443, which "
            "KCoral never follows (the token and the program would go where the URL does not "
            "point)"
        )
        assert shown.action == "if that is the KCoral server, %kcoral connect to its address"


def test_a_connect_to_a_server_that_answers_badly_says_it_answered(shell) -> None:
    with answering(ANSWERS["more than 100 headers"]) as url:
        with pytest.raises(ServerUnreachableError) as failed:
            shell.run_line_magic("kcoral", f"connect {url}")
        assert failed.value.cause == (
            f"could not connect to {url}: it answered, but its answer was refused: more than "
            "100 headers"
        )


def test_every_notebook_line_of_a_server_that_answered_badly_says_it_alike(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a cell, a session's cell, %kcoral connect and %kcoral version word it with one phrase
    # (version said "server URL: answered, but ...", connect "... URL: it answered, but ...")
    trouble = "its answer was refused: more than 100 headers"
    with answering(ANSWERS["more than 100 headers"]) as url:
        with pytest.raises(TransportError) as failed:
            Client(url).health()
        assert shorten(failed.value, url).cause == f"{url} answered, but {trouble}"
        session = SimpleNamespace(url=url, label="session s1")
        assert session_unreachable(failed.value, session).cause == (  # type: ignore[arg-type]
            f"{url}, where session s1 runs, answered, but {trouble}"
        )
        with kcoral_shell(url, monkeypatch, ()) as shell:
            capsys.readouterr()
            shell.run_line_magic("kcoral", "version")
            assert capsys.readouterr().out.splitlines()[1] == (
                f"server {url}: it answered, but {trouble}"
            )
            with pytest.raises(ServerUnreachableError) as connect:
                shell.run_line_magic("kcoral", f"connect {url}")
            assert connect.value.cause == f"could not connect to {url}: it answered, but {trouble}"
