"""A hard link in the benchmark history's place (EXTENSIONS §12.6) is neither read nor
written. A neighbour in a shared folder cannot put a symbolic link there any more, but where
the system lets one link another user's file (macOS; Linux without fs.protected_hardlinks)
a hard link to the user's ~/.zshrc passed every check: a plain file, the user's own. The
magic then appended its JSON lines there, and a server's string holding "$(...)" ran at the
next shell. Here the user links its own file, which Linux allows."""

from __future__ import annotations

import os

import pytest
from test_bench_history import comparison

from kcoral.bench.history import HISTORY_FILE, remember, remember_benchmarks


def test_a_hard_link_in_the_historys_place_is_neither_read_nor_written(tmp_path) -> None:
    victim = tmp_path / "zshrc"
    victim.write_text("export PATH=/usr/bin\n")
    os.link(victim, tmp_path / HISTORY_FILE)
    with pytest.raises(OSError, match=r"it has 2 names \(hard links\)"):
        remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    assert victim.read_text() == "export PATH=/usr/bin\n"


def test_the_magic_says_why_a_hard_linked_history_was_not_recorded(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "zshrc"
    victim.write_text("export PATH=/usr/bin\n")
    os.link(victim, tmp_path / HISTORY_FILE)
    notes = remember_benchmarks("mm", [comparison(1.0, 2.0, 1)], {})
    assert notes == [
        f"kcoral: benchmark 'mm' not recorded in {tmp_path.resolve() / HISTORY_FILE}: OSError: "
        "it has 2 names (hard links), so it may be another file of yours"
    ]
    assert victim.read_text() == "export PATH=/usr/bin\n"


def test_a_history_of_its_own_is_still_kept(tmp_path) -> None:
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    result = remember(comparison(1.0, 2.0, 2), "mm", tmp_path)
    assert result["history"]["previous_time"] is not None
    assert len((tmp_path / HISTORY_FILE).read_text().splitlines()) == 2
