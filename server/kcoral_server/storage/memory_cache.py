"""In-memory LRU blob cache with pins (SERVER.md §10, PROTOCOL.md §9.1).

Holds tensor, bytes and library blobs by SHA-256. Entries a running request uses are pinned
(reference counted): evicting them would free nothing, since the request still holds the
bytes, and would only cost a later cache miss. Pinned entries may push usage over the
budget; eviction skips them and catches up when they are unpinned.

Thread-safe: the front-end resolves blobs in a thread pool.

Who can reach what: keys are opaque to this class; callers key every blob by the identity
that uploaded it (``scoped_key``), so another token holder that names the hash gets a miss,
the same miss whether or not somebody else holds the blob (EXTENSIONS §6). Identical bytes
uploaded by two identities are held twice. The budget is shared, so it is applied fairly
(``fair_eviction``): over it, the scope holding the most bytes gives up its least recently
used unpinned entry, so another token holder uploading a lot flushes its own blobs, not
everyone's (each then costing its owner a ``CACHE_MISS`` and an upload).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Blob = Any  # bytes-like (bytes, bytearray, memoryview, mmap); kept by reference, never copied
# Descriptors held by an entry: the object that keeps them open (a received body, for a
# view of it) and how many, else None. The front-end's is ``body.held_descriptors``.
DescriptorsOf = Callable[[Any], tuple[object, int] | None]
DEFAULT_SCOPE = "default"  # every caller of a server without named tokens


def scoped_key(scope: str, sha256: str) -> str:
    """The cache key of ``scope``'s blob ``sha256`` (the bare hash for ``default``)."""
    return sha256 if scope == DEFAULT_SCOPE else f"{scope}/{sha256}"


def _size(data: Blob) -> int | None:
    try:
        with memoryview(data) as view:
            return view.nbytes
    except TypeError:
        return None


def scope_of(key: str) -> str:
    """The identity a cache key belongs to (``scoped_key`` read back)."""
    scope, slash, _hash = key.partition("/")
    return scope if slash else DEFAULT_SCOPE


class MemoryCache:
    """LRU over unpinned entries, per scope, budget ``capacity_bytes`` shared fairly between
    scopes; objects over a quarter of the budget are not kept."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = max(0, int(capacity_bytes))
        self._lock = threading.Lock()
        # Unpinned entries per scope, least recently used first.
        self._lru: dict[str, OrderedDict[str, tuple[Blob, int]]] = {}
        # key -> [data, size, pin count]
        self._pinned: dict[str, list[Any]] = {}
        self._held: dict[str, int] = {}  # scope -> bytes of its entries, pinned ones included
        self._used = 0

    @property
    def used_bytes(self) -> int:
        """Bytes held by all entries, pinned ones included."""
        return self._used

    def held_descriptors(self, descriptors_of: DescriptorsOf) -> int:
        """How many descriptors the entries keep open (``descriptors_of`` says which object
        holds how many; entries sharing a holder count once): what a leak check must not
        count as leaked."""
        with self._lock:
            blobs = [item[0] for lru in self._lru.values() for item in lru.values()]
            blobs += [entry[0] for entry in self._pinned.values()]
        holders: dict[int, int] = {}
        for held in map(descriptors_of, blobs):
            if held is not None:
                holders[id(held[0])] = held[1]
        return sum(holders.values())

    @property
    def pinned_bytes(self) -> int:
        with self._lock:
            return sum(entry[1] for entry in self._pinned.values())

    def __len__(self) -> int:
        with self._lock:
            return sum(map(len, self._lru.values())) + len(self._pinned)

    def __contains__(self, sha256: object) -> bool:
        if not isinstance(sha256, str):
            return False
        with self._lock:
            return sha256 in self._pinned or sha256 in self._lru.get(scope_of(sha256), ())

    def get(self, sha256: str) -> Blob | None:
        """The blob, marked most recently used, or ``None``."""
        with self._lock:
            entry = self._pinned.get(sha256)
            if entry is not None:
                return entry[0]
            lru = self._lru.get(scope_of(sha256))
            item = None if lru is None else lru.get(sha256)
            if item is None:
                return None
            lru.move_to_end(sha256)  # type: ignore[union-attr]  # found in it
            return item[0]

    def put(self, sha256: str, data: Blob) -> bool:
        """Offer a blob; returns whether the cache holds it afterwards. Never raises."""
        size = _size(data)
        if size is None or size * 4 > self.capacity_bytes:
            return sha256 in self
        scope = scope_of(sha256)
        with self._lock:
            if sha256 in self._pinned:
                return True
            lru = self._lru.setdefault(scope, OrderedDict())
            if sha256 in lru:
                lru.move_to_end(sha256)
                return True
            lru[sha256] = (data, size)
            self._held[scope] = self._held.get(scope, 0) + size
            self._used += size
            self._evict()
            return sha256 in self._lru.get(scope, ())

    def pin(self, sha256: str) -> bool:
        """Protect an entry from eviction (counted); ``False`` if it is not cached."""
        with self._lock:
            entry = self._pinned.get(sha256)
            if entry is not None:
                entry[2] += 1
                return True
            lru = self._lru.get(scope_of(sha256))
            item = None if lru is None else lru.pop(sha256, None)
            if item is None:
                return False
            self._pinned[sha256] = [item[0], item[1], 1]
            return True

    def unpin(self, sha256: str) -> None:
        """Drop one pin; the last one makes the entry the most recently used again."""
        with self._lock:
            entry = self._pinned.get(sha256)
            if entry is None:
                return
            entry[2] -= 1
            if entry[2] > 0:
                return
            del self._pinned[sha256]
            self._lru.setdefault(scope_of(sha256), OrderedDict())[sha256] = (entry[0], entry[1])
            self._evict()

    def _evict(self) -> None:
        # Caller holds the lock. Until within budget (or nothing unpinned is left): the
        # least recently used unpinned entry of the scope holding the most bytes (the
        # fair_eviction rule; one scope alone: plain LRU).
        while self._used > self.capacity_bytes:
            scopes = [scope for scope, lru in self._lru.items() if lru]
            if not scopes:
                return
            scope = max(sorted(scopes), key=self._held.__getitem__)
            _, (_, size) = self._lru[scope].popitem(last=False)
            self._used -= size
            self._held[scope] -= size
