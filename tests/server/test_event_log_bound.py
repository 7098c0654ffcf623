"""``events.jsonl`` under ``--log-events-max-bytes`` (SERVER §13): every request adds its
lines, so any client-token holder makes the file grow; at half the bound it becomes
``events.1.jsonl`` (replacing the one before) and a new file starts, so the two stay
within the bound and no record is lost on the way."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from kcoral_server.storage.event_log import EventLog

LIMIT = 64 * 1024


def _log(tmp_path: Path, limit: int = LIMIT) -> EventLog:
    return EventLog(tmp_path / "logs", console=False, log_programs=True, log_events_max_bytes=limit)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_event_files_stay_within_the_bound_however_many_records_come(tmp_path) -> None:
    log = _log(tmp_path)
    for index in range(5000):
        log.emit("request_received", request_id=f"r{index}", padding="x" * 100)
    run_dir = log.run_dir
    assert run_dir is not None
    sizes = {path.name: path.stat().st_size for path in run_dir.iterdir() if path.is_file()}
    log.close()
    assert set(sizes) == {"events.jsonl", "events.1.jsonl"}
    assert sum(sizes.values()) <= LIMIT + 1024
    newest = _lines(run_dir / "events.jsonl")
    assert newest[-1]["request_id"] == "r4999"


def test_a_new_file_starts_by_naming_the_previous_one_and_nothing_is_lost_between(
    tmp_path,
) -> None:
    log = _log(tmp_path)
    count = 0
    run_dir = log.run_dir
    assert run_dir is not None
    while not (run_dir / "events.1.jsonl").exists():
        log.emit("request_received", request_id=f"r{count}", padding="x" * 100)
        count += 1
    log.emit("request_received", request_id=f"r{count}", padding="x" * 100)
    log.close()
    previous, current = _lines(run_dir / "events.1.jsonl"), _lines(run_dir / "events.jsonl")
    assert current[0]["event"] == "events_log_rotated"
    assert current[0]["previous"] == "events.1.jsonl" and current[0]["limit"] == LIMIT
    ids = [r["request_id"] for r in previous + current if r["event"] == "request_received"]
    assert ids == [f"r{index}" for index in range(count + 1)]
    assert stat.S_IMODE((run_dir / "events.jsonl").stat().st_mode) == 0o600


def test_a_bound_of_zero_never_rotates(tmp_path) -> None:
    log = _log(tmp_path, limit=0)
    for index in range(2000):
        log.emit("request_received", request_id=f"r{index}", padding="x" * 100)
    run_dir = log.run_dir
    assert run_dir is not None
    log.close()
    assert not (run_dir / "events.1.jsonl").exists()
    assert len(_lines(run_dir / "events.jsonl")) == 2000


def test_records_from_many_threads_across_rotations_are_all_whole_lines(tmp_path) -> None:
    log = _log(tmp_path)
    run_dir = log.run_dir
    assert run_dir is not None

    def emit_many(thread: int) -> None:
        for index in range(500):
            log.emit("request_received", request_id=f"t{thread}-{index}", padding="y" * 60)

    threads = [threading.Thread(target=emit_many, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    records = _lines(run_dir / "events.1.jsonl") + _lines(run_dir / "events.jsonl")
    assert all(isinstance(record, dict) for record in records)
    assert log.errors == 0


def test_a_rotation_that_fails_keeps_writing_the_current_file(tmp_path) -> None:
    log = _log(tmp_path)
    run_dir = log.run_dir
    assert run_dir is not None
    os.mkdir(run_dir / "events.1.jsonl")  # a directory in the way: the rename fails
    os.mkdir(run_dir / "events.1.jsonl" / "keep")
    for index in range(1000):
        log.emit("request_received", request_id=f"r{index}", padding="x" * 100)
    log.close()
    records = _lines(run_dir / "events.jsonl")
    assert [r["request_id"] for r in records] == [f"r{index}" for index in range(1000)]
    assert log.errors > 0
    assert not (run_dir / ".events.jsonl.new").exists()


def test_a_bound_smaller_than_a_line_still_rotates_and_never_empties_the_last_half(
    tmp_path,
) -> None:
    log = _log(tmp_path, limit=1)  # half of it rounds to 0: it used to mean "never"
    log.emit("request_received", request_id="r0")
    log.emit("request_received", request_id="r1")
    log.close()
    run_dir = log.run_dir
    assert run_dir is not None
    assert [r["request_id"] for r in _lines(run_dir / "events.1.jsonl")] == ["r0"]
    current = _lines(run_dir / "events.jsonl")
    assert [r["event"] for r in current] == ["events_log_rotated", "request_received"]
