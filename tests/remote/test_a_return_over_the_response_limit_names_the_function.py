"""A remote function whose return value is over the server's ``--max-response-bytes``, against
a real server with a small limit: the error names the function and the limit to raise, the
sizes the server gave stay, and the server keeps serving (EXTENSIONS §10)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from server_process import running_server

from kcoral import Client
from kcoral.errors import KCoralError, RemoteExecutionError

LIMIT = 1_000_000


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(
        tmp_path_factory.mktemp("response-limit"),
        ["--max-response-bytes", str(LIMIT)],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    ) as server:
        yield server.url


def make_big(kind: str) -> object:
    import numpy as np

    return b"x" * 2_000_000 if kind == "bytes" else np.zeros(250_000)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="notes (PEP 678) need Python 3.11+")
@pytest.mark.parametrize("kind", ["bytes", "array"])
@pytest.mark.parametrize("serialization", ["json", "pickle"])
def test_bytes_or_an_array_over_the_limit_names_the_function_and_the_limit_to_raise(
    server_url: str, serialization: str, kind: str
) -> None:
    # Before, a JSON-mode call's note said the value "cannot travel in JSON mode: return
    # JSON values ..., bytes or arrays, or use serialization='pickle'": it was bytes or an
    # array, and pickle mode meets the same limit.
    with Client(server_url) as client:
        big = client.function(serialization=serialization)(make_big)
        with pytest.raises(RemoteExecutionError) as caught:
            big.remote(kind)
        assert "return would exceed the response size limit" in str(caught.value)
        assert f"{LIMIT} bytes left" in str(caught.value)
        assert caught.value.__notes__ == [
            "make_big() returned more than the server sends in one answer: return less, or "
            "raise the server's limit (kcoral server --max-response-bytes)."
        ]
        assert client.function(serialization=serialization)(make_small).remote() == "small"


def make_long_text() -> str:
    return "x" * 2_000_000


def test_a_json_answer_over_the_limit_is_the_documented_500_naming_the_function(
    server_url: str,
) -> None:
    # A JSON value (pickle mode returns bytes, above) makes the whole answer too large.
    # Before: 'results exceed the configured response-size limit: ...', whose function's
    # call it was went unsaid.
    with Client(server_url) as client:
        long_text = client.function()(make_long_text)
        with pytest.raises(KCoralError) as caught:
            long_text.remote()
        error = caught.value
        assert (error.status_code, error.kind) == (500, "response_too_large")
        assert error.message.startswith(
            "make_long_text(): results exceed the configured response-size limit: "
        )
        assert error.message.endswith(
            f"bytes, limit {LIMIT} bytes (max_response_bytes; kcoral server --max-response-bytes)"
        )
        # and the server keeps serving
        assert client.function()(make_small).remote() == "small"


def make_small() -> str:
    return "small"
