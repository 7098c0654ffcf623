"""The benchmark history beside a notebook in a shared folder (EXTENSIONS §12.6): what
another user of that folder can put in the file's place is neither written nor believed."""

from __future__ import annotations

import os
import threading

import pytest
from test_bench_history import comparison

from kcoral.bench.history import HISTORY_FILE, remember, remember_benchmarks


def test_a_symbolic_link_in_the_historys_place_is_not_followed(tmp_path) -> None:
    victim = tmp_path / "bashrc"
    victim.write_text("export PATH=/usr/bin\n")
    (tmp_path / HISTORY_FILE).symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    assert victim.read_text() == "export PATH=/usr/bin\n"


def test_a_dangling_link_does_not_create_its_target(tmp_path) -> None:
    (tmp_path / HISTORY_FILE).symlink_to(tmp_path / "planted")
    with pytest.raises(OSError, match="symbolic link"):
        remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    assert not (tmp_path / "planted").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_history_is_neither_believed_nor_extended(tmp_path) -> None:
    history = tmp_path / HISTORY_FILE
    remember(comparison(1.0, 0.5, 1), "mm", tmp_path)  # a forged "previous run": b fast
    before = history.read_bytes()
    os.chown(history, 65534, 65534)
    with pytest.raises(OSError, match="another user"):
        remember(comparison(1.0, 2.0, 2), "mm", tmp_path)
    assert history.read_bytes() == before


def test_a_fifo_in_the_historys_place_does_not_hang_the_kernel(tmp_path) -> None:
    os.mkfifo(tmp_path / HISTORY_FILE)
    outcome: list[BaseException | None] = []

    def record() -> None:
        try:
            remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=record, daemon=True)
    worker.start()
    worker.join(60)  # a hang, not a time: the read of a FIFO without a writer never returns
    assert outcome and isinstance(outcome[0], OSError) and "not a plain file" in str(outcome[0])


def test_the_magic_says_why_a_linked_history_was_not_recorded(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / HISTORY_FILE).symlink_to(tmp_path / "elsewhere")
    notes = remember_benchmarks("mm", [comparison(1.0, 2.0, 1)], {})
    assert notes == [
        f"kcoral: benchmark 'mm' not recorded in {tmp_path.resolve() / HISTORY_FILE}: "
        "OSError: it is a symbolic link, not a plain file of yours"
    ]


def test_the_history_works_where_the_system_lacks_geteuid_pread_and_o_nonblock(
    tmp_path, monkeypatch
) -> None:
    # the client runs on macOS and Windows too (README "Platforms"): Windows has none of them
    for name in ("geteuid", "pread", "O_NONBLOCK", "O_NOFOLLOW"):
        monkeypatch.delattr(os, name)
    remember(comparison(1.0, 2.0, 1), "mm", tmp_path)
    history = remember(comparison(1.0, 2.0, 2), "mm", tmp_path)["history"]
    assert set(history["changes"]) == {"a", "b"}
    assert len((tmp_path / HISTORY_FILE).read_text().splitlines()) == 2
