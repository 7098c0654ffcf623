"""A token pasted into the server address (``http://TOKEN@host:port``, ``?token=...``), the
way some web tools take one: refused, as before, but without printing the token back. Before,
the refusal quoted the whole address, so in a notebook (``%kcoral connect``, ``KCORAL_URL``)
the token was saved with the cell's output; every entry point shares this rule
(``kcoral.connection.server_address``)."""

from __future__ import annotations

import pytest

from kcoral.cli import main as kcoral_main

SECRET = "pasted-secret-0123456789"


@pytest.mark.parametrize(
    ("address", "shown", "why"),
    [
        (
            f"http://{SECRET}@127.0.0.1:8000",
            "http://***@127.0.0.1:8000",
            "must not contain credentials (a token goes in KCORAL_TOKEN, never the address)",
        ),
        (
            f"http://127.0.0.1:8000/?token={SECRET}",
            "http://127.0.0.1:8000/?***",
            "must not have a query or fragment",
        ),
        (f"http://{SECRET}@127.0.0.1:99999", "http://***@127.0.0.1:99999", "is not a valid URL"),
        # an address the URL parser itself refuses (review: quoted whole)
        (f"http://{SECRET}@[::1:8000", "http://***@[::1:8000", "is not a valid URL"),
    ],
    ids=["credentials", "query", "bad-port", "unparsable"],
)
def test_a_token_pasted_into_the_address_is_refused_without_being_shown(
    address: str, shown: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kcoral_main(["run", "shell", "--url", address, "--", "true"]) == 2
    said = capsys.readouterr().err
    assert SECRET not in said, said
    assert said.startswith(
        f"kcoral run: error: --url is not a valid server address: '{shown}' {why}"
    ), said


@pytest.mark.parametrize(
    ("address", "refusal"),
    [
        (
            f"127.0.0.1:8000/?token={SECRET}",
            "'127.0.0.1:8000/?***': host:port takes no path: give 127.0.0.1:8000",
        ),
        (
            f"{SECRET}@127.0.0.1:8000",
            "'***@127.0.0.1:8000' is not host:port, e.g. 127.0.0.1:8000, or a URL such as "
            "http://host:8000",
        ),
    ],
    ids=["query", "credentials"],
)
def test_a_token_pasted_into_a_host_port_address_is_refused_without_being_shown(
    address: str, refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: quoted whole, and the query one offered http://127.0.0.1:8000/?token=... as
    # the URL to write instead, which the address rule refuses too.
    assert kcoral_main(["run", "shell", "--url", address, "--", "true"]) == 2
    said = capsys.readouterr().err
    assert SECRET not in said, said
    assert said.startswith(
        f"kcoral run: error: --url is not a valid server address: {refusal}\n"
    ), said
