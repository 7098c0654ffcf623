"""A disk cache the server cannot use, or one other local users can write, is said at start
(SERVER §10): before, a cache that never worked said nothing (failures only went to an
internal counter), and a directory others could write let them plant entries unheard of
(cache soak). The hash check keeps planted bytes from being served either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kcoral_server.storage.disk_cache import DiskCache, start_problem
from server_process import start_server


def test_a_usable_cache_of_the_servers_own_says_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    assert start_problem(DiskCache(folder, 4)) is None
    assert start_problem(DiskCache(None, 4)) is None  # no cache, nothing to say


def test_a_cache_folder_under_a_file_is_unusable_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    event, message = start_problem(DiskCache(tmp_path / "file" / "cache", 4)) or ("", "")
    assert event == "disk_cache_unusable"
    assert message.startswith(f"cannot use {tmp_path / 'file' / 'cache'}: ")
    assert message.endswith("uploads are not cached")


def test_a_cache_folder_others_can_write_says_so_and_how_to_close_it(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)
    event, message = start_problem(DiskCache(folder, 4)) or ("", "")
    assert event == "disk_cache_open"
    assert (
        message == f"{folder} has mode 0777: others can write it, and plant entries: chmod 700 it"
    )
    folder.chmod(0o1777)  # a sticky folder (/tmp's mode): others cannot replace our v1/
    assert start_problem(DiskCache(folder, 4)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")
def test_a_cache_folder_of_another_user_says_whose_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    (folder / "v1").mkdir(parents=True)
    os.chown(folder / "v1", 4242, 4242)
    event, message = start_problem(DiskCache(folder, 4)) or ("", "")
    assert event == "disk_cache_open"
    assert message == f"{folder / 'v1'} is owned by uid 4242, not this server's user"


def test_a_server_whose_cache_cannot_work_says_so_at_start_and_serves(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    server = start_server(tmp_path / "server", ["--disk-cache-dir", str(tmp_path / "file" / "c")])
    try:
        found = [e for e in server.events() if e.get("event") == "disk_cache_unusable"]
    finally:
        server.stop()
    (record,) = found
    assert record["level"] == "WARNING" and "uploads are not cached" in record["message"]
