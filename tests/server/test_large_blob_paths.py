"""Large blobs: bodies read in large rounds into a reused buffer, supplied blobs located in
their body by offset, hashes taken while writing, cached blobs served again."""

from __future__ import annotations

import hashlib
import http.client
import mmap
import os
import socket

import pytest
from http_helpers import Response, decode, execute, execute_body, sha256
from kcoral_server.front_door.body import RequestBody, memfd_locations
from kcoral_server.worker.blobs import hashed_parts_memfd

from kcoral.protocol.values import encode_value, fill_part_hashes

MIB = 1 << 20


def received(*pieces: bytes) -> tuple[RequestBody, list[memoryview]]:
    """A finished body of ``pieces`` back to back, and a view of each piece."""
    body = RequestBody(1 << 30)
    for piece in pieces:
        body.write(piece)
    view = body.finish()
    views, offset = [], 0
    for piece in pieces:
        views.append(view[offset : offset + len(piece)])
        offset += len(piece)
    return body, views


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_blobs_are_located_by_offset_in_their_body_and_others_are_copied() -> None:
    first, second = os.urandom(3000), os.urandom(5000)
    body, (_, a, b) = received(b"headers", first, second)
    located, fds, copies = memfd_locations({"a": a, "b": b, "c": b"cached bytes", "d": a[:0]})
    assert fds == [body.fd]
    assert located == [("a", 0, 7, 3000), ("b", 0, 3007, 5000)]
    assert [sha for sha, _ in copies] == ["c", "d"]
    with mmap.mmap(body.fd, 8007, prot=mmap.PROT_READ) as mapped:
        assert mapped[3007:8007] == second
    del a, b
    body.close()


@pytest.mark.parametrize("size", [10, 3 * MIB])
def test_return_parts_are_hashed_while_they_are_written(size: int) -> None:
    parts = [os.urandom(size), bytearray(b"second part"), memoryview(b"")]
    fd, lengths, digests = hashed_parts_memfd(parts)
    assert fd is not None
    try:
        assert lengths == [size, 11, 0]
        assert digests == [hashlib.sha256(bytes(p)).hexdigest() for p in parts]
        assert os.pread(fd, size + 11, 0) == bytes(parts[0]) + b"second part"
    finally:
        os.close(fd)
    assert hashed_parts_memfd([]) == (None, [], [])


def test_deferred_hashes_fill_every_binary_node_in_part_order() -> None:
    value = {"a": [b"one", bytearray(b"two")], "b": {"c": memoryview(b"three")}, "n": 1}
    hashed, _ = encode_value(value, 3)
    deferred, same_parts = encode_value(value, 3, hash_parts=False)
    assert deferred != hashed
    fill_part_hashes(deferred, 3, [hashlib.sha256(bytes(p)).hexdigest() for p in same_parts])
    assert deferred == hashed
    with pytest.raises(ValueError):
        fill_part_hashes(deferred, 3, [])


def test_a_large_cached_blob_reaches_the_worker_again(kcoral_server) -> None:
    data = os.urandom(5 * MIB)
    program = {
        "instructions": [
            {"op": "upload", "id": "b", "kind": "bytes", "blob": sha256(data)},
            {"op": "return", "key": "b", "value": {"$ref": "b"}},
        ]
    }
    first = execute(kcoral_server.url, program, {sha256(data): data})
    second = execute(kcoral_server.url, program)  # the blob now comes from the cache
    third = execute(kcoral_server.url, program)
    for response in (first, second, third):
        assert response.body["status"] == "COMPLETED", response.body
        node = response.body["results"]["b"]
        assert node["sha256"] == sha256(data)
        assert response.parts[node["part"]] == data


def _send_in_pieces(sock: socket.socket, data: bytes, sizes: list[int]) -> None:
    """``data`` in pieces of the given sizes (cycled), each its own ``send``."""
    at, turn = 0, 0
    while at < len(data):
        size = sizes[turn % len(sizes)]
        sock.sendall(data[at : at + size])
        at, turn = at + size, turn + 1


def _answer(sock: socket.socket) -> Response:
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    return decode(answer.status, answer.headers, answer.read())


def test_a_large_body_in_odd_pieces_then_a_small_one_on_the_same_connection(
    kcoral_server,
) -> None:
    # The large body is read into one reused buffer (handlers/large_reads.py): its first
    # bytes arrive with the headers, the rest in pieces smaller and larger than a round.
    data = os.urandom(3 * MIB + 12345)
    program = {
        "instructions": [
            {"op": "upload", "id": "b", "kind": "bytes", "blob": sha256(data)},
            {"op": "return", "key": "b", "value": {"$ref": "b"}},
        ]
    }
    host, port = kcoral_server.url.split("://", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        for blobs in ({sha256(data): data}, {}):  # the second one is small (cached blob)
            content_type, body = execute_body(program, blobs)
            head = (
                f"POST /execute HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            _send_in_pieces(sock, head + body, [len(head) + 100, 7, MIB + 3, 65536, 1])
            response = _answer(sock)
            assert response.status == 200 and response.body["status"] == "COMPLETED"
            assert response.parts[response.body["results"]["b"]["part"]] == data
