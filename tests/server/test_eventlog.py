"""The event log (SERVER.md §13): run directory layout, JSON lines, console mirror."""

from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path

from kcoral_server.storage.event_log import EventLog, format_console_line, format_timestamp

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
RUN_NAME = re.compile(r"\d{8}T\d{6}\.\d{6}Z(-\d+)?")


def records(log: EventLog) -> list[dict]:
    assert log.events_path is not None
    lines = log.events_path.read_bytes().decode("utf-8").splitlines()
    return [json.loads(line) for line in lines]


def make_log(tmp_path: Path, **kwargs) -> tuple[EventLog, io.StringIO]:
    stream = io.StringIO()
    options = {"console": True, "log_programs": True, **kwargs}
    return EventLog(tmp_path / "logs", stream=stream, **options), stream


def test_a_run_directory_holds_events_programs_and_output(tmp_path) -> None:
    log, _ = make_log(tmp_path)
    run_dir = log.run_dir
    assert run_dir is not None
    assert run_dir.parent == tmp_path / "logs" / "runs"
    assert RUN_NAME.fullmatch(run_dir.name)
    assert (run_dir / "events.jsonl").is_file()
    assert (run_dir / "programs").is_dir()
    assert log.output_dir == run_dir / "output" and log.output_dir.is_dir()
    log.close()


def test_two_runs_started_together_get_distinct_directories(tmp_path) -> None:
    logs = [make_log(tmp_path)[0] for _ in range(5)]
    names = {log.run_dir for log in logs}
    assert len(names) == 5
    assert all(RUN_NAME.fullmatch(path.name) for path in names)
    for log in logs:
        log.close()


def test_a_record_is_one_compact_json_line_with_the_header_first(tmp_path) -> None:
    log, _ = make_log(tmp_path)
    log.emit("request_received", request_id="r1", client="127.0.0.1", content_length=12)
    raw = log.events_path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert b": " not in raw and b", " not in raw
    (record,) = records(log)
    assert list(record)[:3] == ["timestamp", "level", "event"]
    assert TIMESTAMP.fullmatch(record["timestamp"])
    assert record == {
        "timestamp": record["timestamp"],
        "level": "INFO",
        "event": "request_received",
        "request_id": "r1",
        "client": "127.0.0.1",
        "content_length": 12,
    }
    log.close()


def test_each_record_is_flushed_as_it_is_written(tmp_path) -> None:
    log, _ = make_log(tmp_path, console=False)
    log.emit("one")
    assert len(records(log)) == 1
    log.emit("two", "WARNING", reason="x")
    assert [r["event"] for r in records(log)] == ["one", "two"]
    assert records(log)[1]["level"] == "WARNING"
    log.close()


def test_non_json_values_are_written_as_their_repr(tmp_path) -> None:
    log, _ = make_log(tmp_path, console=False)
    log.emit("x", path=Path("/a/b"), items={1}, raw=b"\x00")
    (record,) = records(log)
    assert record["path"] == repr(Path("/a/b"))
    assert record["items"] == "{1}"
    assert record["raw"] == repr(b"\x00")
    log.close()


def test_a_record_with_a_non_finite_float_keeps_only_its_header_and_a_repr(tmp_path) -> None:
    log, _ = make_log(tmp_path, console=False)
    log.emit("bad", "ERROR", value=float("nan"), text="y" * 5000)
    (record,) = records(log)
    assert set(record) == {"timestamp", "level", "event", "unencodable_fields"}
    assert record["level"] == "ERROR" and record["event"] == "bad"
    assert record["unencodable_fields"].startswith("{'value': nan")
    assert len(record["unencodable_fields"]) == 2000
    log.close()


def test_lone_surrogates_still_give_a_valid_utf8_line(tmp_path) -> None:
    log, _ = make_log(tmp_path, console=False)
    log.emit("odd", text="a\udcffb")
    (record,) = records(log)
    assert record["text"] == "a\udcffb"
    log.close()


def test_the_console_line_has_timestamp_padded_level_event_and_fields(tmp_path) -> None:
    log, stream = make_log(tmp_path)
    log.emit("request_finished", "WARNING", request_id="r1", http_status=504, elapsed_ms=12.345)
    log.emit("worker_ready", worker_id="cpu/w0")
    lines = stream.getvalue().splitlines()
    timestamp, rest = lines[0].split(" ", 1)
    assert TIMESTAMP.fullmatch(timestamp)
    assert rest == "WARNING request_finished request_id=r1 http_status=504 elapsed_ms=12.3"
    assert lines[1].split(" ", 1)[1] == "INFO    worker_ready worker_id=cpu/w0"
    log.close()


def test_the_console_leaves_out_nulls_and_bulky_fields_and_cuts_long_values() -> None:
    line = format_console_line(
        "T",
        "ERROR",
        "request_finished",
        {
            "error_kind": None,
            "config": {"a": 1},
            "traceback": "tb",
            "versions": {},
            "ops": {},
            "uploads": {},
            "message": "m" * 200,
            "ok": True,
            "multi": "line1\nline2",
            "gpu_ids": [0, 1],
        },
    )
    assert line == (
        "T ERROR   request_finished message=" + "m" * 120 + "..."
        " ok=true multi=line1\\nline2 gpu_ids=[0,1]"
    )


def test_bulky_fields_stay_in_the_file(tmp_path) -> None:
    log, stream = make_log(tmp_path)
    log.emit("server_started", run_dir=str(log.run_dir), config={"device": "cpu"})
    assert records(log)[0]["config"] == {"device": "cpu"}
    assert "config=" not in stream.getvalue()
    log.close()


def test_the_console_mirror_can_be_turned_off(tmp_path) -> None:
    log, stream = make_log(tmp_path, console=False)
    log.emit("quiet")
    assert stream.getvalue() == ""
    log.close()


def test_without_a_log_dir_only_the_console_is_written_and_output_goes_to_a_temp_dir() -> None:
    stream = io.StringIO()
    log = EventLog(None, console=True, log_programs=True, stream=stream)
    assert log.run_dir is None and log.events_path is None
    log.emit("hello", a=1)
    assert "hello a=1" in stream.getvalue()
    assert log.record_program("r1", b"{}") is None
    output = log.output_dir
    assert output.is_dir()
    log.close()
    assert not output.exists()


def test_programs_are_recorded_under_their_request_id(tmp_path) -> None:
    log, _ = make_log(tmp_path)
    request_id = "0f8fad5b-d9cb-469f-a165-70867728950e"
    name = log.record_program(request_id, memoryview(b'{"instructions":[]}'))
    assert name == f"{request_id}.json"
    assert (log.run_dir / "programs" / name).read_bytes() == b'{"instructions":[]}'
    second = log.record_program(request_id, b"{}")
    assert second is not None and second != name
    log.close()


def test_program_recording_can_be_turned_off(tmp_path) -> None:
    log, _ = make_log(tmp_path, log_programs=False)
    assert log.record_program("r1", b"{}") is None
    assert not list((log.run_dir / "programs").iterdir())
    log.close()


def test_a_request_id_that_could_escape_the_directory_is_not_recorded(tmp_path) -> None:
    log, _ = make_log(tmp_path)
    assert log.record_program("../evil", b"{}") is None
    assert log.record_program("", b"{}") is None
    log.close()


def test_logging_failures_never_raise(tmp_path) -> None:
    class BrokenStream(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("console gone")

    log = EventLog(tmp_path / "logs", console=True, log_programs=True, stream=BrokenStream())
    log.emit("a")
    log._file.close()  # simulate the file going away underneath
    log.emit("b", value=1)
    log.close()
    log.emit("after close")
    assert log.errors >= 2


def test_an_unusable_log_dir_falls_back_to_console_only(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    stream = io.StringIO()
    log = EventLog(blocker, console=True, log_programs=True, stream=stream)
    assert log.run_dir is None
    assert log.file_error is not None
    assert "event_log_disabled" in stream.getvalue()
    log.emit("still works")
    assert "still works" in stream.getvalue()
    log.close()


def test_concurrent_emits_never_interleave_lines(tmp_path) -> None:
    log, _ = make_log(tmp_path, console=False)

    def work(n: int) -> None:
        for i in range(200):
            log.emit("tick", worker=n, i=i, pad="x" * 100)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(records(log)) == 800
    log.close()


def test_timestamps_are_utc_with_milliseconds() -> None:
    assert format_timestamp(0.1239) == "1970-01-01T00:00:00.123Z"
    assert format_timestamp(86400 + 3661.5) == "1970-01-02T01:01:01.500Z"
