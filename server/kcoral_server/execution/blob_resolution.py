"""Blob resolution for an admitted request: caches, row 14 (PROTOCOL §9.2).

Supplied blobs go into the memory cache (kinds kept in memory) and the disk cache (file
uploads); every blob the program references is then found in the request, the disk cache or
the memory cache, or reported missing (``CACHE_MISS``). Memory-cache entries the request
uses are pinned until it ends.

Who can reach what: both caches are looked up in the caller's scope (its identity name), so a
program can only get cached bytes its own identity uploaded; another identity's blob is a
``CACHE_MISS`` indistinguishable from a blob nobody uploaded, and the client must send the
bytes (EXTENSIONS §6, PROTOCOL §9 as we implement it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.request import check_tensor_lengths
from kcoral.protocol.schema import Program
from kcoral_server.front_door.body import hold_for_cache, shareable
from kcoral_server.storage.disk_cache import DiskCache
from kcoral_server.storage.memory_cache import DEFAULT_SCOPE, MemoryCache, scoped_key

MEMORY_KINDS = frozenset({"tensor", "bytes", "library"})


@dataclass
class Resolution:
    blobs: dict[str, bytes | memoryview]  # hash -> bytes the request keeps a reference to
    missing: list[str]
    pins: list[str]  # memory-cache keys (``scoped_key``) to unpin when the request ends
    hits: int = 0  # referenced blobs the request did not carry, found in a cache
    hit_bytes: int = 0  # and their bytes


def resolve_blobs(
    memory: MemoryCache,
    disk: DiskCache,
    program: Program,
    supplied: dict[str, memoryview],
    scope: str = DEFAULT_SCOPE,
) -> Resolution:
    """PROTOCOL §9.2 steps 2–5 within ``scope``'s caches (blocking: runs in the executor)."""
    kinds = program.blob_kinds()
    to_disk = {}
    for sha, data in supplied.items():
        used = kinds.get(sha, frozenset())
        if used & MEMORY_KINDS and len(data) * 4 <= memory.capacity_bytes:
            key = scoped_key(scope, sha)
            if memory.get(key) is not None:
                pass  # the same bytes, cached already (and now the most recently used)
            elif shareable(data):
                # The cache outlives the request body: a large blob keeps its sealed body
                # (and its descriptor, handed to later workers as it is) ...
                memory.put(key, data)
                if memory.get(key) is data:
                    hold_for_cache(data)
            else:
                memory.put(key, bytes(data))  # ... anything else is copied
        if "file" in used:
            to_disk[sha] = data
    if to_disk and disk.enabled:
        with contextlib.suppress(Exception):  # the disk cache never fails a request
            disk.put_many(to_disk, scope)
    resolved: dict[str, bytes | memoryview] = {}
    missing: list[str] = []
    pins: list[str] = []
    hits = hit_bytes = 0
    for sha, used in kinds.items():
        needs_memory = bool(used & MEMORY_KINDS)
        key = scoped_key(scope, sha)
        if needs_memory and memory.pin(key):
            pins.append(key)
        if sha in supplied:
            resolved[sha] = supplied[sha]
            continue
        from_disk = from_memory = None
        if "file" in used and disk.enabled:
            with contextlib.suppress(Exception):
                from_disk = disk.get(sha, scope)
        if needs_memory:
            from_memory = memory.get(key)
        if ("file" in used and from_disk is None) or (needs_memory and from_memory is None):
            missing.append(sha)
            if from_memory is not None:
                resolved[sha] = from_memory  # still checked by row 14
            continue
        resolved[sha] = from_disk if from_disk is not None else from_memory  # type: ignore[assignment]
        hits += 1
        hit_bytes += len(memoryview(resolved[sha]))
    try:
        check_tensor_lengths(program, resolved)
    except ValidationError:
        for key in pins:
            memory.unpin(key)
        raise
    return Resolution(resolved, missing, pins, hits, hit_bytes)
