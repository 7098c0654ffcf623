"""A node's early answer reaches the router's client whole: a too-large upload through a
router gets its 413, never a 502 or a reset (``front_door.lingering_close``). Before, the
node's server closed its loopback connection at once after its 413, the tunnel's next body
write failed and took the unread answer with it (502), and the router closed its client's
connection the same way (a reset, or a 413 head without its body): about 1 in 10 too-large
uploads failed so. A real router with client tokens and one real CPU node."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from router_helpers import RouterProcess, router_with_a_node

import kcoral

pytestmark = pytest.mark.slow

TOKEN = "early-answers-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "early-answers-node-token"}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("early-answers")
    node_args = ("--max-request-bytes", "1M")
    with router_with_a_node(
        tmp, f"alice {TOKEN}\n", NODE_ENV, *node_args, node_id="small"
    ) as router:
        yield router


def bytes_program(size: int) -> kcoral.Program:
    program = kcoral.Program()
    program.return_(key="b", value=program.upload(kind="bytes", value=bytes(size)))
    return program


def test_too_large_uploads_through_a_router_all_get_the_nodes_413(router: RouterProcess) -> None:
    with kcoral.Client(router.url, token=TOKEN) as client:
        for _attempt in range(12):
            with pytest.raises(kcoral.KCoralError) as refused:
                client.execute(bytes_program(4 << 20), timeout_seconds=30)
            assert (refused.value.status_code, refused.value.kind) == (413, "request_too_large")
            assert "--max-request-bytes" in refused.value.message
        assert client.execute(bytes_program(1000), timeout_seconds=30)["b"] == bytes(1000)
    assert "tunnel_request_failed" not in router.log()


def test_the_router_reads_the_rest_of_a_refused_body_away_before_it_closes(
    router: RouterProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", router.port), timeout=30) as sock:
        sock.sendall(
            b"POST /execute HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n".encode()
            + b"Content-Type: application/json\r\n"
            + f"Content-Length: {64 << 20}\r\n\r\n".encode()
        )
        sock.sendall(bytes(1 << 20))
        answer = b""
        while not answer.endswith(b"\r\n0\r\n\r\n"):  # chunked: its last chunk
            answer += sock.recv(65536)  # the node's 413, relayed while the body still comes
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413") and b"Connection: close" in head, head
        assert b'"kind":"request_too_large"' in payload  # in a chunk
        # Before: these bytes met a closed socket and were answered by a reset.
        for _ in range(8):
            sock.sendall(bytes(1 << 20))
        sock.shutdown(socket.SHUT_WR)
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
        assert rest == b""  # nothing after the answer but the router's close
