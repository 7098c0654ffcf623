"""The /execute body (``kcoral_server.body``): small declared bodies in memory, others in a
memfd, and where a worker finds each blob."""

from __future__ import annotations

import os

import pytest
from kcoral_server.body import SMALL_BODY_BYTES, RequestBody, memfd_locations


def test_a_small_declared_body_is_received_into_memory_without_a_memfd() -> None:
    body = RequestBody(1 << 20, 11)
    body.write(b"hello ")
    body.write(memoryview(b"world"))
    view = body.finish()
    assert body.fd is None
    assert bytes(view) == b"hello world" and view.readonly
    # a blob inside it is copied into a memfd for the worker
    located, fds, copies = memfd_locations({"a": view[6:]})
    assert (located, fds) == ([], [])
    assert [(sha, bytes(data)) for sha, data in copies] == [("a", b"world")]
    body.close()


def test_a_small_body_that_outgrows_its_declaration_continues_in_a_memfd() -> None:
    body = RequestBody(1 << 20, 10)
    body.write(b"x" * 10)
    body.write(b"y" * SMALL_BODY_BYTES)
    assert body.fd is not None and body.size == 10 + SMALL_BODY_BYTES
    view = body.finish()
    assert bytes(view[:12]) == b"x" * 10 + b"yy" and len(view) == body.size
    fd = body.fd
    body.close()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_an_unknown_or_large_length_still_goes_to_a_memfd() -> None:
    for expected in (None, SMALL_BODY_BYTES + 1):
        body = RequestBody(1 << 30, expected)
        assert body.fd is not None
        body.write(b"abc")
        assert bytes(body.finish()) == b"abc"
        body.close()
