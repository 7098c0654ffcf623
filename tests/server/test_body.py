"""The /execute body (``kcoral_server.front_door.body``): small declared bodies in memory, others
in a
sealed memfd, where a worker finds each blob, and which bodies the memory cache keeps."""

from __future__ import annotations

import gc
import mmap
import os

import pytest
from kcoral_server.front_door.body import (
    SHARED_BLOB_BYTES,
    SMALL_BODY_BYTES,
    RequestBody,
    held_descriptors,
    hold_for_cache,
    memfd_locations,
    shareable,
)


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


def _received(data: bytes) -> RequestBody:
    body = RequestBody(1 << 30, len(data))
    body.write(data)
    body.finish()
    return body


def test_a_received_memfd_body_is_sealed_against_writes_and_resizes() -> None:
    body = _received(b"x" * (SMALL_BODY_BYTES + 1))
    assert body.fd is not None
    # what a program beside us could try with the descriptor it was handed
    with pytest.raises(PermissionError):
        os.pwrite(body.fd, b"changed", 0)
    with pytest.raises(PermissionError):
        os.ftruncate(body.fd, 1)
    with pytest.raises(PermissionError):
        mmap.mmap(body.fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    body.close()


def test_only_a_large_blob_that_is_most_of_its_body_is_shared_with_the_cache() -> None:
    large = SHARED_BLOB_BYTES
    body = _received(b"h" * 100 + b"b" * large + b"t" * 100)
    assert body.view is not None
    assert not shareable(body.view[100 : 100 + large - 1])  # under the size
    assert shareable(body.view[100 : 100 + large])
    body.close()
    half = _received(b"f" * (large + 2) + b"b" * large)  # a file part as large as the blob
    assert half.view is not None
    assert not shareable(half.view[large + 2 :])  # would pin twice its own memory
    half.close()
    small = _received(b"s" * 10)  # received in memory: nothing to share
    assert small.view is not None and not shareable(small.view)
    small.close()


def test_a_body_the_cache_holds_keeps_its_descriptor_until_the_last_view_is_gone() -> None:
    body = _received(os.urandom(SHARED_BLOB_BYTES))
    assert body.view is not None
    fd = body.fd
    entry = body.view[:]
    assert shareable(entry)
    hold_for_cache(entry)
    assert held_descriptors(entry) == (entry.obj, 2)
    body.close()  # the request ends; the cache entry lives on
    os.fstat(fd)  # still open: later workers get it
    located, fds, copies = memfd_locations({"a": entry})
    assert (located, fds, copies) == ([("a", 0, 0, SHARED_BLOB_BYTES)], [fd], [])
    entry.release()  # evicted
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_body_the_cache_does_not_hold_closes_its_descriptor_with_the_request() -> None:
    body = _received(os.urandom(SHARED_BLOB_BYTES))
    assert body.view is not None
    fd = body.fd
    still_referenced = body.view[:]
    assert shareable(still_referenced)  # but no cache entry took it
    body.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    assert held_descriptors(still_referenced) is None
    assert memfd_locations({"a": still_referenced})[2] == [("a", still_referenced)]
