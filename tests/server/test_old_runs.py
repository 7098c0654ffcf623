"""Earlier run folders under ``--log-runs-max`` (SERVER §13): a server restarted without end
(a crash loop, a pod's container, a systemd unit) made a run folder of up to
``--log-programs-max-bytes`` plus ``--log-events-max-bytes`` at each start and never removed
one, so its disk filled a run at a time. Now each start removes the oldest runs past the
bound that no running server holds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kcoral_server.storage.event_log import EventLog, run_dir_name
from kcoral_server.storage.old_runs import hold, remove_old_runs
from server_process import RunningServer, start_server

DAY = 86400.0


def make_run(runs: Path, started: float, *, events: bool = True) -> str:
    """A run folder as a server that started at ``started`` left it."""
    name = run_dir_name(started)
    (runs / name / "programs").mkdir(parents=True)
    (runs / name / "programs" / "r1.json").write_text("{}")
    if events:
        (runs / name / "events.jsonl").write_text("{}\n")
    return name


def test_the_oldest_runs_past_the_bound_go_and_the_newest_stay(tmp_path: Path) -> None:
    now = time.time()
    names = [make_run(tmp_path, now - DAY + hour * 3600) for hour in range(6)]
    outcome = remove_old_runs(tmp_path, keep=4, now=now)
    assert outcome.removed == names[:2] and not outcome.failed
    assert sorted(os.listdir(tmp_path)) == names[2:]
    assert remove_old_runs(tmp_path, keep=0, now=now).removed == []  # 0 keeps every run
    assert sorted(os.listdir(tmp_path)) == names[2:]


def test_a_run_a_server_holds_is_never_removed(tmp_path: Path) -> None:
    now = time.time()
    names = [make_run(tmp_path, now - DAY + hour) for hour in range(3)]
    held = hold(tmp_path / names[0])  # a server still running since yesterday
    try:
        outcome = remove_old_runs(tmp_path, keep=1, now=now)
    finally:
        os.close(held)
    assert outcome.in_use == [names[0]] and outcome.removed == [names[1]]
    assert remove_old_runs(tmp_path, keep=1, now=now).removed == [names[0]]  # once it ended


def test_a_young_run_without_its_events_file_yet_is_kept(tmp_path: Path) -> None:
    # A server starting this moment names its folder before it can lock it.
    now = time.time()
    starting = make_run(tmp_path, now - 5, events=False)
    finished = make_run(tmp_path, now - 4)  # a run that made events.jsonl has locked first
    newest = make_run(tmp_path, now - 1)
    outcome = remove_old_runs(tmp_path, keep=1, now=now)
    assert outcome.removed == [finished]
    assert sorted(os.listdir(tmp_path)) == [starting, newest]
    assert remove_old_runs(tmp_path, keep=1, now=now + 120).removed == [starting]


def test_names_that_are_not_runs_and_links_are_left_alone(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me")
    now = time.time()
    (runs / run_dir_name(now - 3 * DAY)).symlink_to(elsewhere)  # named like a run
    (runs / run_dir_name(now - 2 * DAY)).write_text("a file named like a run")
    (runs / "notes").mkdir()
    old = make_run(runs, now - DAY)
    (runs / old / "link-out").symlink_to(elsewhere)  # a link inside a run is only unlinked
    make_run(runs, now - 10)
    outcome = remove_old_runs(runs, keep=1, now=now)
    assert outcome.removed == [old] and not outcome.failed
    assert (elsewhere / "precious").read_text() == "keep me"
    assert len(os.listdir(runs)) == 4


def test_an_event_log_removes_runs_beside_its_own_and_says_so(tmp_path: Path) -> None:
    runs = tmp_path / "logs" / "runs"
    runs.mkdir(parents=True, mode=0o700)
    old = [make_run(runs, time.time() - DAY + minute * 60) for minute in range(3)]
    log = EventLog(tmp_path / "logs", console=False, log_programs=True)
    try:
        log.remove_old_runs(2)
    finally:
        log.close()
    assert log.run_dir is not None
    assert sorted(os.listdir(runs)) == [old[2], log.run_dir.name]
    records = [json.loads(line) for line in (log.run_dir / "events.jsonl").read_text().splitlines()]
    removed = [r for r in records if r["event"] == "log_runs_removed"]
    assert len(removed) == 1 and removed[0]["removed"] == 2 and removed[0]["level"] == "INFO"


def run_folders(log_dir: Path) -> list[str]:
    return sorted(os.listdir(log_dir / "runs"))


def run_folders_once_at_most(log_dir: Path, count: int) -> list[str]:
    """The run folders once at most ``count`` are left (a start removes old ones in the
    background), or as they are after 30 s."""
    deadline = time.monotonic() + 30
    while len(run_folders(log_dir)) > count and time.monotonic() < deadline:
        time.sleep(0.05)
    return run_folders(log_dir)


def test_restarts_keep_the_newest_runs_and_never_one_a_running_server_writes(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "shared-logs"
    args = ["--log-dir", str(log_dir), "--log-runs-max", "2", "--num-workers", "1"]

    def started(name: str) -> RunningServer:
        return start_server(tmp_path / name, args)

    long_lived = started("long-lived")  # runs through every restart below
    try:
        first = run_folders(log_dir)
        assert len(first) == 1
        for name in ("b", "c"):
            server = started(name)
            server.stop()
        assert len(run_folders(log_dir)) == 3  # runs made within the minute, all with events
        restarted = started("d")
        try:
            kept = run_folders_once_at_most(log_dir, 3)
            # b's run went; the long-lived server's, older still, is in use and stays
            assert first[0] in kept and len(kept) == 3
        finally:
            restarted.stop()
        own_events = [
            json.loads(line)
            for line in (log_dir / "runs" / max(kept) / "events.jsonl").read_text().splitlines()
        ]
        said = [r for r in own_events if r["event"] == "log_runs_removed"]
        assert said and said[0]["removed"] == 1 and said[0]["in_use"] == 1
    finally:
        long_lived.stop()
    last = started("e")
    try:
        left = run_folders_once_at_most(log_dir, 2)
        assert len(left) == 2 and left[0] == max(kept)  # d's, and this start's own
    finally:
        last.stop()
