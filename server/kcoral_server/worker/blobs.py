"""Blob memory in (read-only maps of the front-end's memfds) and return parts out."""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading

from kcoral_server.processes.ipc import BlobSlice

# Prefault the blob maps in one pass (64 MiB = 16,384 separate faults otherwise). Private:
# request bodies arrive write-sealed (``kcoral_server.front_door.body``), and kernels before 6.7
# refuse a shared map of those even read-only; an unwritten private map shares the pages.
_MAP_FLAGS = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
# From this many return bytes on, hashing runs in a second thread while the parts are
# written (both release the GIL); below it a thread costs more than it saves.
_PARALLEL_HASH_BYTES = 1 << 20


class BlobMaps:
    """The blobs of one program: ``sha256 -> memoryview`` over read-only shared memory."""

    def __init__(self, slices: list[BlobSlice], fds: list[int]) -> None:
        self._maps: list[mmap.mmap | None] = []
        self.views: dict[str, memoryview] = {}
        try:
            for fd in fds:
                size = os.fstat(fd).st_size
                # mmap refuses empty files; an empty memfd can only hold empty blobs
                self._maps.append(
                    mmap.mmap(fd, size, flags=_MAP_FLAGS, prot=mmap.PROT_READ) if size else None
                )
        finally:
            for fd in fds:
                os.close(fd)  # the maps keep the memory alive
        for blob in slices:
            mapped = self._maps[blob.fd_index] if 0 <= blob.fd_index < len(self._maps) else None
            if blob.length == 0:
                self.views[blob.sha256] = memoryview(b"")
                continue
            if mapped is None or blob.offset < 0 or blob.offset + blob.length > len(mapped):
                raise ValueError(f"blob {blob.sha256} lies outside its shared memory")
            self.views[blob.sha256] = memoryview(mapped)[blob.offset : blob.offset + blob.length]

    def get(self, sha256: str) -> memoryview:
        try:
            return self.views[sha256]
        except KeyError:
            raise KeyError(f"blob {sha256} was not handed to the worker") from None

    def close(self) -> None:
        for view in self.views.values():
            with contextlib.suppress(BufferError):
                view.release()
        self.views.clear()
        for mapped in self._maps:
            if mapped is not None:
                # still exported (e.g. a NumPy array a program kept): the GC unmaps it later
                with contextlib.suppress(BufferError):
                    mapped.close()
        self._maps.clear()


def _byte_view(part: object) -> memoryview:
    """A flat byte view of a part (NumPy arrays of ml_dtypes cannot export buffers)."""
    try:
        view = memoryview(part)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return memoryview(part.tobytes())  # type: ignore[attr-defined]
    if not view.c_contiguous:
        return memoryview(view.tobytes())
    try:
        return view.cast("B")
    except (TypeError, ValueError):
        return memoryview(view.tobytes())


def parts_memfd(parts: list[object]) -> tuple[int | None, list[int]]:
    """One memfd holding ``parts`` back to back (None when there are none), and lengths."""
    views = [_byte_view(part) for part in parts]
    return _write_memfd(views), [view.nbytes for view in views]


def hashed_parts_memfd(parts: list[object]) -> tuple[int | None, list[int], list[str]]:
    """``parts_memfd`` plus each part's SHA-256 hex digest, hashed while writing."""
    views = [_byte_view(part) for part in parts]
    lengths = [view.nbytes for view in views]
    digests = [""] * len(views)

    def hash_all() -> None:
        for i, view in enumerate(views):
            digests[i] = hashlib.sha256(view).hexdigest()

    if sum(lengths) < _PARALLEL_HASH_BYTES:
        hash_all()
        return _write_memfd(views), lengths, digests
    hasher = threading.Thread(target=hash_all, name="kcoral-return-hash", daemon=True)
    hasher.start()
    try:
        fd = _write_memfd(views)
    finally:
        hasher.join()
    if not all(len(digest) == 64 for digest in digests):  # the thread failed (memory?)
        if fd is not None:
            os.close(fd)
        raise RuntimeError("hashing the return parts failed")
    return fd, lengths, digests


def _write_memfd(views: list[memoryview]) -> int | None:
    if not views:
        return None
    fd = os.memfd_create("kcoral-return", os.MFD_CLOEXEC)
    try:
        for view in views:
            while view:
                written = os.write(fd, view)
                view = view[written:]
    except BaseException:
        os.close(fd)
        raise
    return fd
