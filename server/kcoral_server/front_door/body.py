"""The streamed ``/execute`` body, received into one memfd.

Chunks are appended to an anonymous memory file; once complete it is mapped read-only and
parsed through ``memoryview`` slices. The same descriptor is then handed to the worker with
blob offsets, so supplied blobs reach the worker without another copy. Small bodies (at
most ``SMALL_BODY_BYTES`` declared) stay in memory instead.

Once received, a memfd body is sealed (no write, no resize): the worker that maps it, the
programs it runs, and any program beside us that opens the front-end's memfds under
``/proc`` (same user, no sandbox) cannot change bytes the front-end verified. That is what
lets the memory cache keep a large blob as a view of its body instead of a copy
(``shareable``): the body's descriptor then stays open, owned by its mapping, until the
last cache entry and request that use it are gone, and warm requests hand it to workers
without a copy.

Who reaches this: callers past the 403 (web page) and 401 checks, i.e. a token holder, or
any local program on a token-less loopback server. A body costs memory only for the bytes
that actually arrived: the declared ``Content-Length`` picks the buffer's kind but reserves
nothing (a connection that declares 256 MiB and trickles a byte holds one byte,
EXTENSIONS §6).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import time
import weakref
from collections.abc import Mapping

import numpy as np

# Prefault mapped memfds in one pass (64 MiB = 16,384 separate faults otherwise). Private:
# a read-only shared map of a write-sealed memfd is refused by kernels before 6.7, and a
# private map that is never written shares the memfd's pages all the same.
_MAP_FLAGS = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
# The memory cache keeps a blob as a view of its body (no copy) from this size on, when the
# blob is at least half the body (a small blob must not pin a large body's memory) ...
SHARED_BLOB_BYTES = 1 << 20
# ... and while fewer bodies than this are held for the cache: each holds a descriptor.
MAX_CACHED_BODIES = 64


class BodyMap(mmap.mmap):
    """The read-only mapping of a received body. ``memfd`` stays open while the request
    runs; once the memory cache holds a view (``cached``) the mapping owns the descriptor
    and closes it when the last view is gone."""

    memfd: int = -1
    sealed: bool = False
    cached: bool = False
    owns_memfd: bool = False

    def __del__(self) -> None:
        if self.owns_memfd and self.memfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.memfd)
            self.memfd = -1


# Bodies whose mapping a cache entry has referenced, while they live (for the count limit).
_cached_bodies: weakref.WeakSet[BodyMap] = weakref.WeakSet()


class BodyTooLarge(Exception):
    """The body grew past ``max_request_bytes``."""


# A body declared at most this long is received into memory: the memfd's create, reserve,
# write, truncate, map, unmap and close cost more than the request's own work. Blobs in it
# are copied into a memfd for the worker only when there are any. Measured 2026-12-01 on
# the quiet 2-core machine, 3 alternating rounds of 1,500 trivial requests (reused worker):
# front-end CPU 0.92-0.99 ms per request in memory against 0.97-1.03 ms through a memfd
# (about 5 % less; p50 latency equal within noise), so this second path stays (issue 21.5).
SMALL_BODY_BYTES = 64 * 1024


class RequestBody:
    """Receives a request body of at most ``limit`` bytes."""

    def __init__(self, limit: int, expected: int | None = None) -> None:
        self.limit = limit
        self.size = 0
        self.opened_at = time.monotonic()  # just after its request's head passed the checks
        self.fd: int | None = None
        self._buffer: bytearray | None = None
        if expected is not None and expected <= SMALL_BODY_BYTES:
            self._buffer = bytearray()
        else:
            self._open_memfd()
        self._map: BodyMap | None = None
        self.view: memoryview | None = None

    def _open_memfd(self) -> None:
        # No ``fallocate`` of the declared length: that reserved memory for bytes that may
        # never come (a declared 256 MiB trickled a byte at a time held 256 MiB), and
        # appending 1 MiB writes to an unreserved memfd measured no slower.
        self.fd = os.memfd_create("kcoral-request", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)

    def write(self, chunk: bytes | memoryview) -> None:
        if self.fd is None and self._buffer is None:
            return  # closed
        if self.size + len(chunk) > self.limit:
            raise BodyTooLarge
        if self._buffer is not None:
            if len(self._buffer) + len(chunk) <= SMALL_BODY_BYTES:
                self._buffer += chunk
                self.size += len(chunk)
                return
            # longer than declared: continue in a memfd
            held, self._buffer, self.size = self._buffer, None, 0
            self._open_memfd()
            self._pwrite(memoryview(held))
        self._pwrite(memoryview(chunk))

    def _pwrite(self, view: memoryview) -> None:
        assert self.fd is not None
        while view:
            written = os.pwrite(self.fd, view, self.size)
            self.size += written
            view = view[written:]

    def finish(self) -> memoryview:
        """The received bytes, read-only (a memfd body is mapped)."""
        if self._buffer is not None:
            self.view = memoryview(self._buffer).toreadonly()
            return self.view
        assert self.fd is not None
        if self.size == 0:
            self.view = memoryview(b"")
        else:
            sealed = _seal(self.fd)
            self._map = BodyMap(self.fd, self.size, flags=_MAP_FLAGS, prot=mmap.PROT_READ)
            self._map.memfd = self.fd
            self._map.sealed = sealed
            self.view = memoryview(self._map)
        return self.view

    def close(self) -> None:
        """Release the mapping and descriptor (views still exported keep the map alive)."""
        if self.view is not None:
            with contextlib.suppress(BufferError):
                self.view.release()
            self.view = None
        handed_over = False
        map_left = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # views still exported
                # A cache entry may hand this body to later workers: the mapping keeps the
                # descriptor until its last view is gone. Other views (a request's blobs
                # that are still referenced) only need the memory, which the map keeps.
                handed_over = self._map.owns_memfd = self._map.cached
                map_left = self._map
            self._map = None
        if self.fd is not None and not handed_over:
            os.close(self.fd)
            if map_left is not None:
                map_left.memfd = -1  # views that outlive the request hold memory only
        self.fd = None
        self._buffer = None


def _seal(fd: int) -> bool:
    """Forbid every later change of the memfd's bytes and size; False where the kernel
    refuses (the body then works as before, but is never shared with the cache)."""
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        return False
    return True


def shareable(data: memoryview) -> bool:
    """Whether the memory cache may keep ``data`` (a supplied blob) as it is, a view of its
    sealed body, instead of a copy."""
    body = data.obj
    return (
        isinstance(body, BodyMap)
        and not body.closed
        and body.sealed
        and data.nbytes >= SHARED_BLOB_BYTES
        and data.nbytes * 2 >= len(body)
        and (body.cached or len(_cached_bodies) < MAX_CACHED_BODIES)
    )


def hold_for_cache(data: memoryview) -> None:
    """Mark ``data``'s body as held by a cache entry (call once the cache stores ``data``):
    its descriptor then outlives the request, owned by the mapping."""
    body = data.obj
    assert isinstance(body, BodyMap)
    body.cached = True
    _cached_bodies.add(body)


def held_descriptors(data: object) -> tuple[object, int] | None:
    """The body whose descriptors a cache entry ``data`` keeps open, and how many: its
    memfd and the mapping's own duplicate (Python's ``mmap`` keeps one until closed)."""
    body = data.obj if isinstance(data, memoryview) else None
    if isinstance(body, BodyMap) and body.cached and not body.closed:
        return body, 1 + (body.memfd >= 0)
    return None


def _address(buffer: memoryview | mmap.mmap) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


def memfd_locations(
    blobs: Mapping[str, bytes | memoryview],
) -> tuple[list[tuple[str, int, int, int]], list[int], list[tuple[str, bytes | memoryview]]]:
    """Hand-over plan for the worker: ``(sha256, fd index, offset, length)`` for every blob
    inside a received body (this request's or one the memory cache kept), the descriptors
    they index, and the blobs that must be copied into a memfd first."""
    located: list[tuple[str, int, int, int]] = []
    fds: list[int] = []
    index_of: dict[int, int] = {}
    copies: list[tuple[str, bytes | memoryview]] = []
    for sha, data in blobs.items():
        body = data.obj if isinstance(data, memoryview) else None
        if (
            not isinstance(data, memoryview)
            or not isinstance(body, BodyMap)
            or body.closed
            or body.memfd < 0
            or not data.nbytes
        ):
            copies.append((sha, data))
            continue
        offset = _address(data) - _address(body)
        if not 0 <= offset <= len(body) - data.nbytes:
            copies.append((sha, data))
            continue
        index = index_of.setdefault(body.memfd, len(fds))
        if index == len(fds):
            fds.append(body.memfd)
        located.append((sha, index, offset, data.nbytes))
    return located, fds, copies


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
