"""A request body stops being sent once the server has answered ahead of it (CLIENT_API §2.1
step 12): a refused token or a body over a limit the client did not know is answered from the
headers, and the client sent the whole body before it read that answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kcoral.connection.http import HttpTransport
from kcoral.connection.transport import Request

TOKEN = "a-token-made-as-the-readme-makes-one-0123456789"
BODY_BYTES = 1 << 30
_ZEROS = bytes(1 << 20)


class CountedZeros:
    """A streamed part of ``size`` zero bytes that counts what the transport took of it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.taken = 0

    def chunks(self) -> Iterator[bytes]:
        while self.taken < self.size:
            piece = _ZEROS[: self.size - self.taken]
            self.taken += len(piece)
            yield piece


@pytest.fixture
def server_with_a_token(server_factory, tmp_path):
    token_file = tmp_path / "client.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return server_factory("--auth-token-file", str(token_file))


@pytest.mark.parametrize(
    ("token", "status"),
    [
        pytest.param(TOKEN, 413, id="over the limit, which the client did not ask"),
        pytest.param("a-token-the-server-does-not-know", 401, id="a refused token"),
    ],
)
def test_a_large_body_stops_once_the_server_answered_and_the_connection_is_not_reused(
    server_with_a_token, token, status
):
    body = CountedZeros(BODY_BYTES)
    headers = {"Authorization": f"Bearer {token}"}
    transport = HttpTransport(server_with_a_token.url, headers=headers, connect_timeout_seconds=10)
    try:
        request = Request(
            "POST",
            "/execute",
            {"Content-Type": "multipart/form-data; boundary=kcoral-x"},
            [body],
            BODY_BYTES,
        )
        answer = transport.handle_request(request)
        assert answer.status == status
        assert body.taken < BODY_BYTES // 4, f"{body.taken >> 20} MiB of 1024 were sent"
        assert transport.handle_request(Request("GET", "/health")).status == 200
    finally:
        transport.close()
