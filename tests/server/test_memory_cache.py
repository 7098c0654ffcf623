"""The front-end's in-memory LRU blob cache with pins (SERVER.md §10)."""

from __future__ import annotations

import threading

from kcoral_server.storage.memory_cache import MemoryCache


def blob(size: int, fill: int = 0) -> bytes:
    return bytes([fill]) * size


def test_a_put_blob_comes_back_by_reference() -> None:
    cache = MemoryCache(1000)
    data = bytearray(b"abc")
    cache.put("h", data)
    assert cache.get("h") is data
    assert "h" in cache
    assert cache.used_bytes == 3


def test_a_missing_hash_is_none() -> None:
    cache = MemoryCache(1000)
    assert cache.get("nope") is None
    assert "nope" not in cache


def test_memoryviews_are_kept_without_copying() -> None:
    buffer = bytearray(200)
    view = memoryview(buffer)[10:60]
    cache = MemoryCache(1000)
    cache.put("h", view)
    assert cache.get("h") is view
    assert cache.used_bytes == 50


def test_objects_larger_than_a_quarter_of_the_budget_are_not_kept() -> None:
    cache = MemoryCache(400)
    assert cache.put("big", blob(101)) is False
    assert "big" not in cache
    assert cache.put("fits", blob(100)) is True
    assert cache.used_bytes == 100


def test_the_least_recently_used_entry_is_evicted_first() -> None:
    cache = MemoryCache(400)
    for name in "abcd":
        cache.put(name, blob(100))
    cache.get("a")  # a becomes the most recently used
    cache.put("e", blob(100))
    assert "b" not in cache
    assert all(name in cache for name in "acde")
    assert cache.used_bytes == 400


def test_putting_an_existing_hash_refreshes_it_without_double_counting() -> None:
    cache = MemoryCache(400)
    for name in "abcd":
        cache.put(name, blob(100))
    cache.put("a", blob(100))
    assert cache.used_bytes == 400
    cache.put("e", blob(100))
    assert "a" in cache and "b" not in cache


def test_pinned_entries_are_never_evicted_and_may_exceed_the_budget() -> None:
    cache = MemoryCache(400)
    for name in "abcd":
        cache.put(name, blob(100))
        assert cache.pin(name)
    assert cache.put("e", blob(100)) is False  # nothing unpinned to make room for it
    assert all(name in cache for name in "abcd")
    assert cache.used_bytes == 400
    assert cache.pinned_bytes == 400


def test_pins_are_reference_counted() -> None:
    cache = MemoryCache(200)
    cache.put("a", blob(50))
    assert cache.pin("a") and cache.pin("a")
    cache.unpin("a")
    cache.put("b", blob(50))
    cache.put("c", blob(50))
    cache.put("d", blob(50))
    cache.put("e", blob(50))
    assert "a" in cache  # still pinned once
    cache.unpin("a")
    for name in "fghi":
        cache.put(name, blob(50))
    assert "a" not in cache


def test_unpinning_over_budget_evicts_down_to_the_budget() -> None:
    cache = MemoryCache(200)
    cache.put("a", blob(50))
    cache.put("b", blob(50))
    cache.pin("a")
    cache.pin("b")
    for name in "cde":
        cache.put(name, blob(50))
    assert cache.used_bytes == 200
    cache.unpin("a")
    cache.unpin("b")
    assert cache.used_bytes <= 200


def test_pinning_a_missing_entry_reports_false_and_unpinning_it_is_harmless() -> None:
    cache = MemoryCache(100)
    assert cache.pin("missing") is False
    cache.unpin("missing")
    cache.put("a", blob(1))
    cache.unpin("a")  # not pinned: ignored
    assert "a" in cache


def test_put_never_raises_on_odd_input() -> None:
    cache = MemoryCache(100)
    assert cache.put("x", object()) is False  # type: ignore[arg-type]
    assert cache.put("y", None) is False  # type: ignore[arg-type]
    zero = MemoryCache(0)
    assert zero.put("z", blob(1)) is False


def test_concurrent_puts_gets_and_pins_keep_the_accounting_exact() -> None:
    cache = MemoryCache(4000)

    def work(worker: int) -> None:
        for i in range(300):
            key = f"{worker}-{i % 40}"
            cache.put(key, blob(100, worker))
            if cache.pin(key):
                assert cache.get(key) is not None
                cache.unpin(key)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.used_bytes <= 4000
    assert cache.used_bytes == 100 * len(cache)
    assert cache.pinned_bytes == 0


def test_held_descriptors_counts_each_holder_once_pinned_entries_included() -> None:
    class Holder:
        pass

    first, second = Holder(), Holder()
    holders = {"a": (first, 2), "b": (first, 2), "c": (second, 1)}
    cache = MemoryCache(1 << 20)
    for key in ("a", "b", "c", "plain"):
        cache.put(key, key.encode())
    cache.pin("c")

    def descriptors_of(blob: bytes) -> tuple[object, int] | None:
        return holders.get(blob.decode())

    assert cache.held_descriptors(descriptors_of) == 3
    cache.unpin("c")
    assert cache.held_descriptors(lambda blob: None) == 0
