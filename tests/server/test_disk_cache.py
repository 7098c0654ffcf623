"""The persistent file-blob cache (SERVER.md §10): layout, verification, eviction, and that
storage errors are only ever misses or skipped writes."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest
from file_permissions import needs_file_permissions
from kcoral_server.storage import disk_cache
from kcoral_server.storage.disk_cache import DiskCache

MIB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored_path(root: Path, data: bytes) -> Path:
    h = sha(data)
    return root / "v1" / h[:2] / h


def age(path: Path, seconds_ago: float) -> None:
    st = path.stat()
    os.utime(path, (st.st_atime - seconds_ago, st.st_mtime - seconds_ago))


def test_a_stored_blob_is_read_back(tmp_path) -> None:
    cache = DiskCache(tmp_path / "c", 1)
    data = b"hello file"
    cache.put_many({sha(data): data})
    assert cache.get(sha(data)) == data
    assert sha(data) in cache


def test_the_layout_is_v1_two_hex_digits_then_the_hash_with_private_modes(tmp_path) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)
    data = b"layout"
    cache.put_many({sha(data): memoryview(data)})
    path = stored_path(root, data)
    assert path.is_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "v1").stat().st_mode) == 0o700
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_missing_blob_is_a_miss(tmp_path) -> None:
    assert DiskCache(tmp_path / "c", 1).get("0" * 64) is None


def test_malformed_hashes_never_touch_the_filesystem(tmp_path) -> None:
    cache = DiskCache(tmp_path / "c", 1)
    cache.put_many({"../../escape": b"x", "ABC": b"y"})
    assert cache.get("../../etc/passwd") is None
    assert not list((tmp_path / "c" / "v1").iterdir())
    assert not (tmp_path / "escape").exists()


def test_a_corrupted_file_is_a_miss_and_is_removed(tmp_path) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)
    data = b"precious"
    cache.put_many({sha(data): data})
    path = stored_path(root, data)
    path.write_bytes(b"tampered")
    assert cache.get(sha(data)) is None
    assert not path.exists()
    cache.put_many({sha(data): data})  # a later upload repairs it
    assert cache.get(sha(data)) == data


def test_a_read_refreshes_the_mtime(tmp_path) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)
    data = b"old"
    cache.put_many({sha(data): data})
    path = stored_path(root, data)
    age(path, 3600)
    before = path.stat().st_mtime
    assert cache.get(sha(data)) == data
    assert path.stat().st_mtime > before + 1000


def test_eviction_after_a_write_removes_the_oldest_files_down_to_the_budget(tmp_path) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)  # 1 MiB budget
    blobs = [bytes([i]) * (400 * 1024) for i in range(3)]
    cache.put_many({sha(blobs[0]): blobs[0]})
    age(stored_path(root, blobs[0]), 300)
    cache.put_many({sha(blobs[1]): blobs[1]})
    age(stored_path(root, blobs[1]), 200)
    assert cache.get(sha(blobs[0])) == blobs[0]  # read: now the youngest
    cache.put_many({sha(blobs[2]): blobs[2]})  # 1200 KiB > 1 MiB: one must go
    assert not stored_path(root, blobs[1]).exists()
    assert stored_path(root, blobs[0]).exists()
    assert stored_path(root, blobs[2]).exists()


def test_objects_larger_than_the_whole_budget_are_not_stored(tmp_path) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)
    big = b"x" * (MIB + 1)
    cache.put_many({sha(big): big})
    assert not stored_path(root, big).exists()
    exact = b"y" * MIB
    cache.put_many({sha(exact): exact})
    assert stored_path(root, exact).exists()


def test_start_up_removes_stray_temporaries_and_evicts_to_the_budget(tmp_path) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 2)
    blobs = [bytes([i]) * (700 * 1024) for i in range(3)]
    for i, data in enumerate(blobs):
        cache.put_many({sha(data): data})
        age(stored_path(root, data), 1000 - i * 100)
    stray = stored_path(root, blobs[0]).parent / ".tmp-deadbeef"
    stray.write_bytes(b"partial")
    DiskCache(root, 1)  # a smaller budget at the next start
    assert not stray.exists()
    remaining = [data for data in blobs if stored_path(root, data).exists()]
    assert remaining == [blobs[2]]


@pytest.mark.parametrize(("path", "capacity"), [(None, 10), ("dir", 0)])
def test_a_disabled_cache_stores_nothing(tmp_path, path, capacity) -> None:
    cache = DiskCache(None if path is None else tmp_path / path, capacity)
    assert cache.enabled is False
    cache.put_many({sha(b"a"): b"a"})
    assert cache.get(sha(b"a")) is None
    assert not (tmp_path / "dir").exists()


def test_an_uncreatable_directory_gives_misses_and_skipped_writes() -> None:
    cache = DiskCache(Path("/proc/kcoral-cannot-exist/files"), 1)
    cache.put_many({sha(b"a"): b"a"})
    assert cache.get(sha(b"a")) is None
    assert cache.errors > 0


def test_a_root_that_is_a_file_gives_misses_and_skipped_writes(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    cache = DiskCache(blocker, 1)
    cache.put_many({sha(b"a"): b"a"})
    assert cache.get(sha(b"a")) is None


@needs_file_permissions
@pytest.mark.file_permissions
def test_a_read_only_directory_gives_misses_and_skipped_writes(tmp_path) -> None:
    root = tmp_path / "c"
    DiskCache(root, 1)
    (root / "v1").chmod(0o500)
    try:
        cache = DiskCache(root, 1)
        cache.put_many({sha(b"a"): b"a"})
        assert cache.get(sha(b"a")) is None
    finally:
        (root / "v1").chmod(0o700)


def test_a_read_only_filesystem_gives_skipped_writes(tmp_path, monkeypatch) -> None:
    # Root ignores permission bits, so inject EROFS where the cache creates files.
    cache = DiskCache(tmp_path / "c", 1)
    real_open = os.open

    def read_only_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(disk_cache.os, "open", read_only_open)
    cache.put_many({sha(b"a"): b"a"})
    assert cache.get(sha(b"a")) is None
    assert cache.errors > 0


def test_a_full_disk_leaves_no_temporary_file_behind(tmp_path, monkeypatch) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)
    data = b"z" * 1000

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache.os, "replace", no_space)
    cache.put_many({sha(data): data})
    monkeypatch.undo()
    assert cache.get(sha(data)) is None
    shard = stored_path(root, data).parent
    assert not [p for p in shard.iterdir() if p.name.startswith(".tmp-")]


def test_an_unreadable_file_is_a_miss(tmp_path, monkeypatch) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)
    cache.put_many({sha(b"a"): b"a"})

    def failing_open(path, flags, *args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(disk_cache.os, "open", failing_open)
    assert cache.get(sha(b"a")) is None


def test_a_symlink_in_the_cache_is_not_followed(tmp_path) -> None:
    root = tmp_path / "c"
    cache = DiskCache(root, 1)
    data = b"secret elsewhere"
    target = tmp_path / "outside"
    target.write_bytes(data)
    link = stored_path(root, data)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    assert cache.get(sha(data)) is None


def test_concurrent_writers_share_the_directory_safely(tmp_path) -> None:
    root = tmp_path / "c"
    caches = [DiskCache(root, 4) for _ in range(2)]
    blobs = [bytes([i]) * 4096 for i in range(40)]

    def write(cache: DiskCache) -> None:
        for data in blobs:
            cache.put_many({sha(data): data})

    threads = [threading.Thread(target=write, args=(c,)) for c in caches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(caches[0].get(sha(data)) == data for data in blobs)
