"""Unit tests of ``kcoral_server.jobs.spill``: private files for finished jobs' bodies.

The end-to-end behaviour (results leave memory, files go with their jobs) is tested against
real servers in ``tests/security/test_identity_jobs.py``.
"""

from __future__ import annotations

import os
import stat

import pytest
from kcoral_server.jobs import spill as job_spill
from kcoral_server.jobs.spill import SpillDirectory


def test_a_body_is_written_owner_only_and_read_back_in_pieces_from_any_offset(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(job_spill, "READ_CHUNK_BYTES", 4)
    spill = SpillDirectory(tmp_path)
    stored = spill.write([b"hello ", memoryview(b"world")])
    assert stored.length == 11
    assert stat.S_IMODE(os.stat(stored.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(stored.path.parent).st_mode) == 0o700
    assert list(stored.chunks()) == [b"hell", b"o wo", b"rld"]
    assert b"".join(stored.chunks(6)) == b"world"


def test_an_open_read_survives_the_removal_of_its_file(tmp_path) -> None:
    stored = SpillDirectory(tmp_path).write([b"x" * 10])
    pieces = stored.chunks()
    first = next(pieces)  # opened
    stored.remove()
    assert not stored.path.exists()
    assert first + b"".join(pieces) == b"x" * 10
    with pytest.raises(FileNotFoundError):
        next(stored.chunks())


def test_close_removes_everything_and_refuses_later_writes(tmp_path) -> None:
    spill = SpillDirectory(tmp_path)
    one, two = spill.write([b"1"]), spill.write([b"2"])
    assert one.path.parent == two.path.parent and one.path != two.path
    spill.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        spill.write([b"3"])
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_no_partial_file(tmp_path) -> None:
    spill = SpillDirectory(tmp_path)

    def broken():
        yield b"partial"
        raise OSError("disk full")

    with pytest.raises(OSError):
        spill.write(broken())
    assert spill.path is not None and list(spill.path.iterdir()) == []


def test_a_write_under_way_at_close_fails_so_the_answer_stays_in_memory_and_leaves_nothing(
    tmp_path,
) -> None:
    spill = SpillDirectory(tmp_path)
    spill.write([b"first"])  # the directory exists, as it does once a job has spilled

    def chunks():
        yield b"a" * 1000
        spill.close()  # shutdown, while this result is half written
        yield b"b" * 1000

    with pytest.raises(OSError):
        spill.write(chunks())
    assert os.listdir(tmp_path) == []
