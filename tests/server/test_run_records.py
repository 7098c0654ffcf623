"""run_records.return_record: a worker's return memfd is checked before it is mapped.

The attacker is the program on the worker (uploaded code), which can send any frame with
any descriptor: parts that do not match it must end the run as an invalid worker response
(a ``ValueError`` here), never map past the memfd's end (a later ``SIGBUS``).
"""

from __future__ import annotations

import mmap
import os

import pytest
from kcoral_server.execution.records import return_record
from kcoral_server.processes import ipc


def memfd_with(data: bytes) -> int:
    fd = os.memfd_create("test-return")
    os.write(fd, data)
    return fd


def test_a_return_s_parts_are_views_of_its_memfd() -> None:
    maps: list[mmap.mmap] = []
    message = ipc.ReturnProduced(index=0, key="r", node={"t": "bytes"}, part_lengths=[3, 2])
    record = return_record(message, [memfd_with(b"abcde")], maps)
    assert [bytes(part) for part in record.parts] == [b"abc", b"de"]
    assert len(maps) == 1
    for part in record.parts:
        part.release()
    maps[0].close()


def test_a_memfd_shorter_than_its_parts_is_refused_before_it_is_mapped() -> None:
    maps: list[mmap.mmap] = []
    fd = memfd_with(b"ab")
    message = ipc.ReturnProduced(index=0, key="r", node={}, part_lengths=[1 << 20])
    with pytest.raises(ValueError, match="shorter"):
        return_record(message, [fd], maps)
    assert maps == []
    with pytest.raises(OSError):
        os.fstat(fd)  # the descriptor was closed


@pytest.mark.parametrize(
    ("lengths", "fd_count"),
    [([-1], 1), ([4], 0), ([], 1), ([1], 2)],
    ids=["negative-length", "parts-without-memfd", "memfd-without-parts", "two-memfds"],
)
def test_parts_that_do_not_match_their_descriptors_are_refused(
    lengths: list[int], fd_count: int
) -> None:
    fds = [memfd_with(b"xxxx") for _ in range(fd_count)]
    message = ipc.ReturnProduced(index=0, key="r", node={}, part_lengths=lengths)
    with pytest.raises(ValueError, match="do not match"):
        return_record(message, fds, [])
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_return_node_that_is_not_an_object_is_refused() -> None:
    message = ipc.ReturnProduced(index=0, key="r", node=["not", "an", "object"], part_lengths=[])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an object"):
        return_record(message, [], [])
