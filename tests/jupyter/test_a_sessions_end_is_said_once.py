"""A session's end is said once: the server's words begin ``session ended``, and the cell's
line read 'session 3f2a1b2c on URL has ended: session ended after 4 s without a program' (and
'... has ended: session ended: job J did not stop within 5 s of an interrupt'). Now 'session
3f2a1b2c on URL ended after 4 s without a program'. Words of another kind keep 'has ended:'."""

from __future__ import annotations

from kcoral_jupyter.notebook_session import LOCAL_SERVER_GONE, ended_clause


def test_the_servers_session_ended_is_not_said_twice() -> None:
    assert ended_clause("session ended after 4 s without a program") == (
        "ended after 4 s without a program"
    )
    assert ended_clause("session ended: job J did not stop within 5 s of an interrupt") == (
        "ended: job J did not stop within 5 s of an interrupt"
    )
    assert ended_clause("session ended by its owner") == "ended by its owner"


def test_other_words_and_none_keep_has_ended() -> None:
    assert ended_clause(LOCAL_SERVER_GONE) == f"has ended: {LOCAL_SERVER_GONE}"
    assert ended_clause("ended") == "has ended"
    assert ended_clause(None) == "has ended"
