"""Unit tests of ``kcoral_server.front_door.callers``: token files, the identity header,
authentication.

Decision logic only; the same rules are exercised against real servers in
``tests/security/test_identity_jobs.py`` and ``tests/security/test_identity_caches.py``.
"""

from __future__ import annotations

import pytest
from kcoral_server.front_door import callers as identity_module
from kcoral_server.front_door.callers import (
    DEFAULT,
    Authenticator,
    Identity,
    parse_identity_header,
    parse_tokens,
)


def test_one_bare_token_is_the_default_identity() -> None:
    assert parse_tokens("  s3cret \n") == {"s3cret": DEFAULT}
    assert parse_tokens("# a comment\n\ns3cret\n") == {"s3cret": DEFAULT}


def test_named_lines_map_tokens_to_identities_with_an_optional_admin_mark() -> None:
    tokens = parse_tokens("alice TA\n# ops\nroot TR admin\n\nbob TB\n")
    assert tokens == {
        "TA": Identity("alice"),
        "TR": Identity("root", admin=True),
        "TB": Identity("bob"),
    }


def test_a_single_named_line_is_an_identity_not_a_token() -> None:
    assert parse_tokens("alice TA") == {"TA": Identity("alice")}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty"),
        ("# only a comment\n", "is empty"),
        ("alice TA\nbob\n", "line 2"),
        ("alice TA extra\n", "line 1"),
        ("alice TA admin more\n", "line 1"),
        ("alice TA\n-bob TB\n", "invalid identity name"),
        ("alice TA\nbob/x TB\n", "invalid identity name"),
        ("alice TA\nalice TB\n", "listed twice"),
        ("alice TA\nbob TA\n", "already used"),
        ("a1 T1\nb2 T2\n" + "x" * 65 + " T3\n", "invalid identity name"),
    ],
)
def test_malformed_token_files_name_the_bad_line(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_tokens(text)


def test_the_error_never_repeats_a_token() -> None:
    with pytest.raises(ValueError) as caught:
        parse_tokens("alice very-secret-token\nbob very-secret-token\n")
    assert "very-secret-token" not in str(caught.value)


def test_owners_are_compared_by_name_and_admins_own_everything() -> None:
    assert Identity("alice").owns("alice")
    assert not Identity("alice").owns("bob")
    assert Identity("root", admin=True).owns("bob")
    assert DEFAULT.owns("default") and not DEFAULT.owns("alice")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("alice", Identity("alice")),
        ("root;admin", Identity("root", admin=True)),
        (" bob ", Identity("bob")),
        (None, None),
        ("", None),
        ("alice;root", None),
        ("alice;admin;admin", None),
        ("../etc", None),
        ("al ice", None),
        ("x" * 65, None),
        ("alice\r\nX-Evil: 1", None),
    ],
)
def test_the_identity_header_is_parsed_strictly(value, expected) -> None:
    assert parse_identity_header(value) == expected


def test_the_header_round_trips() -> None:
    for who in (Identity("alice"), Identity("root", admin=True), DEFAULT):
        assert parse_identity_header(who.header_value()) == who


def test_an_open_server_makes_everyone_default_whatever_they_claim() -> None:
    open_server = Authenticator(None)
    assert open_server.open
    assert open_server.authenticate(None, None) == DEFAULT
    assert open_server.authenticate("Bearer anything", "root;admin") == DEFAULT


def test_tokens_select_their_identity_and_anything_else_is_refused() -> None:
    auth = Authenticator(parse_tokens("alice TA\nroot TR admin\n"))
    assert not auth.open
    assert auth.authenticate("Bearer TA", None) == Identity("alice")
    assert auth.authenticate("Bearer TR", None) == Identity("root", admin=True)
    for wrong in (None, "", "Bearer", "Bearer ", "Bearer TB", "bearer TA", "Bearer TA ", "TA"):
        assert auth.authenticate(wrong, None) is None


def test_a_client_cannot_claim_an_identity_with_the_header() -> None:
    auth = Authenticator(parse_tokens("alice TA\nroot TR admin\n"), router_secret="RS")
    assert auth.authenticate("Bearer TA", "root;admin") == Identity("alice")
    assert auth.authenticate(None, "root;admin") is None


def test_only_the_router_secret_makes_the_header_believed() -> None:
    auth = Authenticator(None, router_secret="RS")
    assert not auth.open  # a node child serves its tunnel only
    assert auth.authenticate("Bearer RS", "alice") == Identity("alice")
    assert auth.authenticate("Bearer RS", "root;admin") == Identity("root", admin=True)
    assert auth.authenticate("Bearer RS", None) == DEFAULT
    assert auth.authenticate("Bearer RS", "bad name") is None  # malformed: refused
    assert auth.authenticate("Bearer rs", "alice") is None
    assert auth.authenticate(None, "alice") is None


def test_every_token_is_compared_so_timing_does_not_say_which_matched(monkeypatch) -> None:
    calls: list[bytes] = []
    real = identity_module.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(identity_module.hmac, "compare_digest", counting)
    auth = Authenticator(parse_tokens("a TA\nb TB\nc TC\n"))
    assert auth.authenticate("Bearer TA", None) == Identity("a")  # the first one matches
    assert len(calls) == 3
    calls.clear()
    assert auth.authenticate("Bearer nope", None) is None
    assert len(calls) == 3


def test_non_ascii_authorization_is_refused_not_raised() -> None:
    auth = Authenticator(parse_tokens("alice TA\n"))
    assert auth.authenticate("Bearer \udcff\u00e9", None) is None
