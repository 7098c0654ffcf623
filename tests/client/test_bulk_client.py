"""Client-side bulk uploads: immutable bytes are not copied, mutable buffers are."""

from __future__ import annotations

import hashlib
import os

import kcoral
import kcoral.program as program_module


def test_an_immutable_bytes_upload_is_kept_without_a_copy() -> None:
    data = bytes(range(256)) * 4096
    program = kcoral.Program()
    program.upload(kind="bytes", value=data)
    (blob,) = program.blobs.values()
    assert blob is data
    assert program.blobs[hashlib.sha256(data).hexdigest()] is data


def test_a_bytearray_changed_after_upload_does_not_change_what_is_sent() -> None:
    data = bytearray(b"x" * 100_000)
    program = kcoral.Program()
    program.upload(kind="bytes", value=data)
    data[:4] = b"diff"
    ((sha, blob),) = program.blobs.items()
    assert type(blob) is bytes and blob == b"x" * 100_000
    assert sha == hashlib.sha256(blob).hexdigest()


def test_a_bytes_subclass_is_still_snapshotted_as_plain_bytes() -> None:
    class Tagged(bytes):
        pass

    program = kcoral.Program()
    program.upload_file(blob=Tagged(b"abc"), path="a.txt")
    (blob,) = program.blobs.values()
    assert type(blob) is bytes and blob == b"abc"


def test_a_large_bytearray_is_named_by_the_hash_of_its_snapshot() -> None:
    data = bytearray(os.urandom(1 << 16) * 40)  # above the parallel-hash threshold
    program = kcoral.Program()
    program.upload(kind="bytes", value=data)
    ((sha, blob),) = program.blobs.items()
    assert type(blob) is bytes and blob == data
    assert sha == hashlib.sha256(blob).hexdigest()


def test_a_bytearray_changed_while_it_is_hashed_is_named_by_its_snapshot(monkeypatch) -> None:
    data = bytearray(os.urandom(1 << 16) * 40)
    real = program_module._sha256

    def meddling(buffer):  # another thread writes into the caller's buffer meanwhile
        if buffer is data:
            data[:4] = bytes(4) if data[:4] != bytes(4) else b"abcd"
        return real(buffer)

    monkeypatch.setattr(program_module, "_sha256", meddling)
    program = kcoral.Program()
    program.upload(kind="bytes", value=data)
    ((sha, blob),) = program.blobs.items()
    assert sha == hashlib.sha256(blob).hexdigest()
