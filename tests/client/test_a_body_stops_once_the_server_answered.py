"""A request body stops being sent once the server has answered ahead of it (CLIENT_API §2.1
step 12): a refused token or a body over a limit the client did not know is answered from the
headers, and the client sent the whole body before it read that answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kcoral.connection.http import HttpTransport
from kcoral.connection.transport import Request, body_pieces
from kcoral.protocol.multipart import PIECE_BYTES

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


def test_a_body_is_cut_once_into_pieces_of_at_most_one_mib_whatever_holds_its_bytes():
    # the pieces the early-answer look and the progress line both go by: a blob in memory
    # went out whole from body_pieces and was cut again by each of them
    data = bytes(range(256)) * (2 * PIECE_BYTES // 256) + b"tail!"
    grid = memoryview(bytearray(data[: 3 * 1024 * 1024 // 2])).cast("B", (1536, 1024))
    streamed = CountedZeros(PIECE_BYTES + 3)
    pieces = list(body_pieces([b"head", data, grid, streamed]))
    sizes = [len(piece) if isinstance(piece, bytes) else piece.nbytes for piece in pieces]
    assert sizes == [4, PIECE_BYTES, PIECE_BYTES, 5, PIECE_BYTES, PIECE_BYTES // 2, PIECE_BYTES, 3]
    assert b"".join(pieces) == b"head" + data + grid.tobytes() + bytes(PIECE_BYTES + 3)
