"""``@client.function(timeout=..., output_limit_bytes=...)`` checked where it is written
(CLIENT_API §8): a bad value is a ``TypeError`` or ``ValueError`` naming the option as the
user wrote it, before any call. Before, it failed only at the first call, as the server's
``HTTP 400: option 'timeout_seconds' must be ...``, a name the user never wrote."""

from __future__ import annotations

import pytest

from kcoral import Client


def add_one(x: int) -> int:
    return x + 1


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"timeout": -1}, ValueError, "timeout must be a number of seconds > 0, not -1"),
        ({"timeout": 0}, ValueError, "timeout must be a number of seconds > 0, not 0"),
        ({"timeout": float("nan")}, ValueError, "timeout must be a number of seconds > 0"),
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds, not str"),
        ({"timeout": True}, TypeError, "timeout must be a number of seconds, not bool"),
        ({"output_limit_bytes": -1}, ValueError, "output_limit_bytes must be >= 0, not -1"),
        ({"output_limit_bytes": 1.5}, TypeError, "output_limit_bytes must be an int, not float"),
    ],
)
def test_a_bad_option_is_refused_when_the_function_is_decorated(
    options: dict, error: type[Exception], message: str
) -> None:
    with Client("http://127.0.0.1:9") as client:  # nothing is sent: no server needed
        with pytest.raises(error) as refused:
            client.function(**options)(add_one)
    assert str(refused.value).startswith(message)


def test_good_options_are_kept_as_given() -> None:
    with Client("http://127.0.0.1:9") as client:
        remote = client.function(timeout=2.5, output_limit_bytes=0)(add_one)
    assert (remote.timeout, remote.output_limit_bytes) == (2.5, 0)
