"""The bound on a run's stored programs (SERVER §13, ``--log-programs-max-bytes``).

The attacker is another client-token holder whose programs are all stored: the oldest are
removed for the newest, a program larger than the bound is not stored, and trimming is
reported by one ``programs_log_trimmed`` WARNING per minute. The attack itself, against a
real server, is tests/security/test_program_log_flood.py.
"""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from file_permissions import needs_file_permissions
from kcoral_server.storage.event_log import EventLog
from kcoral_server.storage.program_records import BLOCK, ProgramRecords, charged


def make_log(tmp_path: Path, limit: int) -> EventLog:
    return EventLog(
        tmp_path / "logs",
        console=False,
        log_programs=True,
        log_programs_max_bytes=limit,
        stream=io.StringIO(),
    )


def program(size: int) -> bytes:
    """A program's JSON of exactly ``size`` bytes."""
    return b'{"instructions":[],"pad":"' + b"x" * (size - 28) + b'"}'


def stored(log: EventLog) -> dict[str, int]:
    assert log.run_dir is not None
    return {p.name: p.stat().st_size for p in (log.run_dir / "programs").iterdir()}


def trimmed_events(log: EventLog) -> list[dict[str, Any]]:
    assert log.events_path is not None
    lines = log.events_path.read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "programs_log_trimmed"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def records(tmp_path: Path, limit: int) -> tuple[ProgramRecords, list[dict], Clock, list[int]]:
    directory = tmp_path / "programs"
    directory.mkdir()
    reports: list[dict] = []
    failures: list[int] = []
    clock = Clock()
    held = ProgramRecords(
        directory, limit, report=reports.append, failed=lambda: failures.append(1), clock=clock
    )
    return held, reports, clock, failures


def test_a_file_is_charged_in_whole_blocks_at_least_one() -> None:
    assert charged(0) == BLOCK
    assert charged(1) == BLOCK
    assert charged(BLOCK) == BLOCK
    assert charged(BLOCK + 1) == 2 * BLOCK


def test_the_oldest_programs_are_removed_first_to_make_room_for_a_new_one(tmp_path) -> None:
    log = make_log(tmp_path, 3 * BLOCK)
    for request_id in ("a", "b", "c"):
        assert log.record_program(request_id, program(BLOCK)) == f"{request_id}.json"
    assert sorted(stored(log)) == ["a.json", "b.json", "c.json"]
    assert log.record_program("d", program(BLOCK)) == "d.json"
    assert sorted(stored(log)) == ["b.json", "c.json", "d.json"]
    # A program of two blocks takes the two oldest.
    assert log.record_program("e", program(2 * BLOCK)) == "e.json"
    assert sorted(stored(log)) == ["d.json", "e.json"]
    log.close()


def test_the_folder_never_holds_more_than_the_bound(tmp_path) -> None:
    limit = 64 * 1024
    log = make_log(tmp_path, limit)
    sizes = [100, 5000, 20000, 4096, 30000, 1, 64 * 1024, 12345, 40000, 7] * 5
    for index, size in enumerate(sizes):
        assert log.record_program(f"r{index}", program(max(size, 28))) is not None
        on_disk = stored(log)
        assert sum(charged(size) for size in on_disk.values()) <= limit
    assert f"r{len(sizes) - 1}.json" in stored(log)  # the newest is always kept
    log.close()


def test_a_program_larger_than_the_whole_bound_is_not_stored_and_removes_nothing(
    tmp_path,
) -> None:
    log = make_log(tmp_path, 2 * BLOCK)
    assert log.record_program("small", program(BLOCK)) == "small.json"
    assert log.record_program("huge", program(2 * BLOCK + 1)) is None
    assert sorted(stored(log)) == ["small.json"]
    (event,) = trimmed_events(log)
    assert event["level"] == "WARNING"
    assert (event["removed"], event["bytes"], event["refused"]) == (0, 0, 1)
    assert event["limit"] == 2 * BLOCK
    log.close()


def test_a_bound_of_zero_stores_no_program(tmp_path) -> None:
    log = make_log(tmp_path, 0)
    assert log.record_program("r1", b"{}") is None
    assert stored(log) == {}
    assert trimmed_events(log) == []  # stored nothing by choice, not for lack of room
    log.close()


def test_trimming_is_reported_once_within_the_rate_window_with_counts_since_the_last(
    tmp_path,
) -> None:
    held, reports, clock, _ = records(tmp_path, 2 * BLOCK)
    for index in range(10):
        assert held.store(f"r{index}", program(BLOCK)) == f"r{index}.json"
        clock.now += 1
    # The first removal (r2 pushed out r0) is reported at once; the next 7 wait.
    assert len(reports) == 1
    assert (reports[0]["removed"], reports[0]["bytes"], reports[0]["refused"]) == (1, BLOCK, 0)
    assert held.store("huge", program(3 * BLOCK)) is None
    assert len(reports) == 1
    clock.now += 60
    held.store("late", program(BLOCK))
    assert len(reports) == 2
    assert (reports[1]["removed"], reports[1]["bytes"], reports[1]["refused"]) == (
        8,
        8 * BLOCK,
        1,
    )
    assert held.take_pending_report() is None


def test_a_flood_through_the_event_log_writes_one_warning_and_the_rest_at_close(
    tmp_path,
) -> None:
    log = make_log(tmp_path, 4 * BLOCK)
    for index in range(50):
        log.record_program(f"r{index}", program(BLOCK))
    (first,) = trimmed_events(log)
    assert first["removed"] == 1 and first["limit"] == 4 * BLOCK
    log.close()
    first_again, last = trimmed_events(log)
    assert first_again == first
    assert last["removed"] == 45 and last["bytes"] == 45 * BLOCK


def test_a_file_removed_by_hand_meanwhile_counts_as_freed(tmp_path) -> None:
    held, reports, _, failures = records(tmp_path, 2 * BLOCK)
    held.store("a", program(BLOCK))
    held.store("b", program(BLOCK))
    os.unlink(held.directory / "a.json")  # an operator clearing old programs by hand
    assert held.store("c", program(BLOCK)) == "c.json"
    assert held.total == 2 * BLOCK
    assert sorted(p.name for p in held.directory.iterdir()) == ["b.json", "c.json"]
    assert reports[0]["removed"] == 1 and failures == []


@needs_file_permissions
@pytest.mark.file_permissions
def test_a_file_that_cannot_be_removed_stays_charged_so_the_bound_still_holds(tmp_path) -> None:
    held, _, _, failures = records(tmp_path, 2 * BLOCK)
    held.store("a", program(BLOCK))
    held.store("b", program(BLOCK))
    os.chmod(held.directory, 0o500)
    try:
        assert held.store("c", program(BLOCK)) is None  # no room made, nothing crashed
    finally:
        os.chmod(held.directory, 0o700)
    assert failures  # counted as a logging error
    assert held.total == 2 * BLOCK  # both still on disk, both still charged


def test_a_failed_unlink_that_is_not_a_missing_file_never_raises(tmp_path, monkeypatch) -> None:
    held, _, _, failures = records(tmp_path, BLOCK)
    held.store("a", program(BLOCK))

    def refuse(path: Any) -> None:
        raise PermissionError(13, "refused", str(path))

    monkeypatch.setattr(os, "unlink", refuse)
    assert held.store("b", program(BLOCK)) is None
    assert len(failures) == 1 and held.total == BLOCK
    monkeypatch.undo()  # the error passes: the stuck file goes when room is next needed
    assert held.store("c", program(BLOCK)) == "c.json"
    assert held.total == BLOCK and not (tmp_path / "programs" / "a.json").exists()


def test_the_same_request_id_twice_keeps_both_programs_within_the_bound(tmp_path) -> None:
    log = make_log(tmp_path, 2 * BLOCK)
    assert log.record_program("same", b"{}") == "same.json"
    assert log.record_program("same", b"{}") == "same-1.json"
    assert log.record_program("same", b"{}") == "same-2.json"  # the oldest made room
    assert sorted(stored(log)) == ["same-1.json", "same-2.json"]
    log.close()


def test_a_request_id_sent_again_and_again_costs_one_open_per_program(
    tmp_path, monkeypatch
) -> None:
    held, _, _, _ = records(tmp_path, 1000 * BLOCK)
    opened = []
    real_open = os.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    for _ in range(200):  # before: the k-th repeat tried k names (quadratic, on the loop)
        held.store("same", b"{}")
    assert len(opened) == 201  # the first repeat finds its name taken once, no other


def test_concurrent_stores_keep_the_bound_and_the_count(tmp_path) -> None:
    limit = 8 * BLOCK
    held, _, _, failures = records(tmp_path, limit)

    def flood(thread: int) -> None:
        for index in range(40):
            held.store(f"t{thread}-{index}", program(BLOCK + thread * 100))

    threads = [threading.Thread(target=flood, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    on_disk = [p.stat().st_size for p in held.directory.iterdir()]
    assert held.total == sum(charged(size) for size in on_disk) <= limit
    assert failures == []
