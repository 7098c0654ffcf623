"""The launcher's heap folded into huge pages (``launcher.huge_pages``): what is folded,
and that a process's memory reads the same afterwards."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kcoral_server.processes.launcher import huge_pages
from kcoral_server.processes.launcher.huge_pages import big_anonymous_regions

SMAPS = """\
00400000-00500000 r-xp 00000000 08:01 123 /usr/bin/python3
Anonymous:             0 kB
01000000-06000000 rw-p 00000000 00:00 0 [heap]
Anonymous:         81920 kB
7f0000000000-7f0000200000 rw-p 00000000 00:00 0
Anonymous:          2048 kB
7f1000000000-7f1004000000 rw-s 00000000 00:01 9 /dev/shm/x
Anonymous:         65536 kB
7f2000000000-7f2002000000 r--p 00000000 00:00 0
Anonymous:         32768 kB
7f3000000000-7f3002000000 rw-p 00000000 00:00 0
Rss:               32768 kB
Anonymous:         32768 kB
"""


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def fold_problem() -> str | None:
    """Why this kernel cannot fold pages (None: it can)."""
    release = tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())
    if release < (6, 1):
        return f"MADV_COLLAPSE needs Linux 6.1, this is {os.uname().release}"
    if _thp_mode() in ("never", "absent"):
        return f"transparent huge pages are {_thp_mode()} here"
    return None


def test_only_big_writable_private_anonymous_regions_are_folded(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert big_anonymous_regions(str(smaps)) == [
        (0x01000000, 0x06000000),
        (0x7F3000000000, 0x7F3002000000),
    ]


def test_an_unreadable_smaps_folds_nothing(tmp_path):
    assert big_anonymous_regions(str(tmp_path / "missing")) == []


FOLD_AND_READ = """
import json, sys, time
from kcoral_server.processes.launcher.huge_pages import collapse_heap
data = bytearray(64 << 20)
for i in range(0, len(data), 4096):
    data[i] = i % 251
folded = collapse_heap()
for _ in range(5):  # a machine busy with other work may have no free huge page this moment
    if folded >= 32 << 20:
        break
    time.sleep(0.2)
    folded = collapse_heap()
huge = sum(int(line.split()[1]) for line in open("/proc/self/smaps")
           if line.startswith("AnonHugePages:"))
same = all(data[i] == i % 251 for i in range(0, len(data), 4096))
print(json.dumps({"folded": folded, "huge_kib": huge, "same": same}))
"""


@pytest.mark.skipif(fold_problem() is not None, reason=str(fold_problem()))
def test_a_big_heap_is_folded_into_huge_pages_and_reads_the_same():
    found = subprocess.run(
        [sys.executable, "-c", FOLD_AND_READ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    state = json.loads(found.stdout)
    assert state["same"]
    assert state["folded"] >= 32 << 20
    assert state["huge_kib"] >= 32 << 10


def _fold_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: list[int]):
    """``collapse_heap`` over one 32 MiB region whose folds fail with ``failures`` (errno
    values, in order) before they succeed; returns what it folded and its calls."""
    smaps = tmp_path / "smaps"
    smaps.write_text(
        "7f3000000000-7f3002000000 rw-p 00000000 00:00 0\nAnonymous:         32768 kB\n"
    )
    calls: list[int] = []

    def madvise(start: int, length: int, advice: int) -> int:
        calls.append(start)
        if len(calls) <= len(failures):
            ctypes.set_errno(failures[len(calls) - 1])
            return -1
        return 0

    monkeypatch.setattr(huge_pages, "_madvise", lambda: madvise)
    return huge_pages.collapse_heap(str(smaps)), calls


def test_a_region_the_kernel_cannot_fold_for_now_is_asked_again(tmp_path, monkeypatch):
    """EAGAIN is the kernel's "busy now": a fork server that folded nothing then paid for
    every fork of its life (a loaded CI machine once folded 0 bytes here)."""
    folded, calls = _fold_calls(tmp_path, monkeypatch, [errno.EAGAIN, errno.EAGAIN])
    assert folded == 32 << 20 and len(calls) == 3


def test_a_region_without_a_free_huge_page_is_left_and_a_kernel_that_cannot_fold_stops(
    tmp_path, monkeypatch
):
    assert _fold_calls(tmp_path, monkeypatch, [errno.ENOMEM])[0] == 0  # asked once
    assert len(_fold_calls(tmp_path, monkeypatch, [errno.ENOMEM])[1]) == 1
    assert _fold_calls(tmp_path, monkeypatch, [errno.EINVAL])[0] == 0
