"""The streamed ``/execute`` body, received into one memfd.

Chunks are appended to an anonymous memory file; once complete it is mapped read-only and
parsed through ``memoryview`` slices. The same descriptor is then handed to the worker with
blob offsets, so supplied blobs reach the worker without another copy.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

# Prefault mapped memfds in one pass (64 MiB = 16,384 separate faults otherwise).
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class BodyTooLarge(Exception):
    """The body grew past ``max_request_bytes``."""


class RequestBody:
    """Receives a request body of at most ``limit`` bytes."""

    def __init__(self, limit: int, expected: int | None = None) -> None:
        self.limit = limit
        self.size = 0
        self.fd: int | None = os.memfd_create("kcoral-request", os.MFD_CLOEXEC)
        if expected:
            # Reserve the pages up front so writes never reallocate.
            with contextlib.suppress(OSError):
                os.posix_fallocate(self.fd, 0, expected)
        self._map: mmap.mmap | None = None
        self.view: memoryview | None = None

    def write(self, chunk: bytes | memoryview) -> None:
        if self.fd is None:
            return
        if self.size + len(chunk) > self.limit:
            raise BodyTooLarge
        view = memoryview(chunk)
        while view:
            written = os.pwrite(self.fd, view, self.size)
            self.size += written
            view = view[written:]

    def finish(self) -> memoryview:
        """Map the received bytes read-only and return them."""
        assert self.fd is not None
        os.ftruncate(self.fd, self.size)  # drop any fallocated tail
        if self.size == 0:
            self.view = memoryview(b"")
        else:
            self._map = mmap.mmap(self.fd, self.size, flags=_MAP_FLAGS, prot=mmap.PROT_READ)
            self.view = memoryview(self._map)
        return self.view

    def offset_of(self, part: memoryview) -> int:
        """Offset of a slice of ``view`` inside the body (for handing blobs over by fd)."""
        assert self.view is not None
        if not len(part):
            return 0
        base = np.frombuffer(self.view, dtype=np.uint8).__array_interface__["data"][0]
        start = np.frombuffer(part, dtype=np.uint8).__array_interface__["data"][0]
        offset = start - base
        if not 0 <= offset <= self.size - len(part):
            raise ValueError("slice is not part of the request body")
        return offset

    def close(self) -> None:
        """Release the mapping and descriptor (views still exported keep the map alive)."""
        if self.view is not None:
            with contextlib.suppress(BufferError):
                self.view.release()
            self.view = None
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def bytes_memfd(
    items: list[tuple[str, bytes | memoryview]],
) -> tuple[int, list[tuple[str, int, int]]]:
    """Write ``items`` back to back into a new memfd: (fd, [(sha256, offset, length)]).

    Used for blobs resolved from the caches (blocking: run it in the executor)."""
    fd = os.memfd_create("kcoral-blobs", os.MFD_CLOEXEC)
    slices = []
    offset = 0
    try:
        for sha, data in items:
            view = memoryview(data)
            start = offset
            while view:
                written = os.pwrite(fd, view, offset)
                offset += written
                view = view[written:]
            slices.append((sha, start, offset - start))
    except BaseException:
        os.close(fd)
        raise
    return fd, slices
