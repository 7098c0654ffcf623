"""Shared byte bounds are applied fairly between identities (``storage.fair_eviction``):
over the bound the owner holding the most bytes gives up its oldest entry, so another token
holder who stores a lot flushes its own entries, not everyone's oldest. The memory cache,
the disk cache and finished jobs (tests/jobs/test_job_retention.py) follow the rule."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kcoral_server.storage.disk_cache import DiskCache
from kcoral_server.storage.fair_eviction import fair_victims
from kcoral_server.storage.memory_cache import MemoryCache, scoped_key


def _victims(entries: list[tuple[str, int]], budget: int) -> list[int]:
    indexed = list(enumerate(entries))
    chosen = fair_victims(indexed, budget, owner=lambda e: e[1][0], size=lambda e: e[1][1])
    return [index for index, _ in chosen]


def test_one_owner_gives_up_its_oldest_first() -> None:
    assert _victims([("a", 10), ("a", 10), ("a", 10)], 20) == [0]


def test_the_owner_holding_the_most_gives_up_its_oldest_until_the_rest_fit() -> None:
    entries = [("alice", 5), ("bob", 40), ("bob", 40), ("alice", 5), ("bob", 40)]
    assert _victims(entries, 40) == [1, 2, 4]  # bob's, oldest first; alice keeps both


def test_nothing_goes_within_the_budget_and_ties_are_broken_by_name() -> None:
    assert _victims([("a", 10), ("b", 10)], 20) == []
    assert _victims([("b", 10), ("a", 10)], 10) == [1]


def test_the_memory_cache_evicts_a_flooding_identitys_blobs_before_anothers() -> None:
    cache = MemoryCache(1000)
    alice = scoped_key("alice", "a" * 64)
    cache.put(alice, b"x" * 100)  # the least recently used entry of all
    bob = [scoped_key("bob", f"{i:064x}") for i in range(10)]
    for key in bob:
        cache.put(key, b"y" * 200)
    assert alice in cache  # before: plain LRU took it at the fifth of bob's blobs
    assert cache.used_bytes <= 1000
    assert bob[-1] in cache and bob[0] not in cache


def test_the_memory_cache_of_one_identity_is_plain_lru() -> None:
    cache = MemoryCache(1000)
    for name in "abcde":
        cache.put(name, b"z" * 250)
    assert "a" not in cache and all(name in cache for name in "bcde")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_disk_cache_evicts_a_flooding_identitys_files_before_anothers(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    cache = DiskCache(root, 1)  # 1 MiB
    victim = b"v" * (100 * 1024)
    cache.put_many({_sha(victim): victim}, scope="alice")
    path = root / "v1" / "id-alice" / _sha(victim)[:2] / _sha(victim)
    stat = path.stat()
    os.utime(path, (stat.st_atime - 600, stat.st_mtime - 600))  # the oldest file of all
    flood = [bytes([i]) * (300 * 1024) for i in range(5)]
    for data in flood:
        cache.put_many({_sha(data): data}, scope="bob")
    assert cache.get(_sha(victim), "alice") == victim  # before: the oldest file went first
    assert cache.get(_sha(flood[-1]), "bob") == flood[-1]
    assert cache.get(_sha(flood[0]), "bob") is None


def test_a_disk_cache_file_that_cannot_be_removed_makes_the_next_oldest_go(
    tmp_path: Path, monkeypatch
) -> None:
    root = tmp_path / "cache"
    cache = DiskCache(root, 1)  # 1 MiB
    blobs = [bytes([i]) * (400 * 1024) for i in range(3)]
    for age, data in zip((300, 200), blobs[:2], strict=False):
        cache.put_many({_sha(data): data})
        path = root / "v1" / _sha(data)[:2] / _sha(data)
        stat = path.stat()
        os.utime(path, (stat.st_atime - age, stat.st_mtime - age))
    oldest = _sha(blobs[0])
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(oldest):
            raise PermissionError(13, "refused", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    cache.put_many({_sha(blobs[2]): blobs[2]})  # 1200 KiB: one must go, the oldest cannot
    monkeypatch.undo()
    assert cache.get(oldest) == blobs[0]  # it stayed
    assert cache.get(_sha(blobs[1])) is None  # so the next oldest went instead
    assert cache.get(_sha(blobs[2])) == blobs[2]
