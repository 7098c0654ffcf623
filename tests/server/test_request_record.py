"""The request's log record (``execution/request_record.py``) and the admitted program's
deadline and output limit (``execution/admitted.py``): decision logic whose real
counterpart is tested through servers (``test_execute.py``, ``test_failures.py``, jobs)."""

from __future__ import annotations

from kcoral_server.execution.admitted import AdmittedProgram
from kcoral_server.execution.blob_resolution import Resolution
from kcoral_server.execution.request_record import RequestRecord, RunTimes, SeatAssignment
from kcoral_server.execution.responses import SATURATED, ProgramOutcome, RequestFailed
from kcoral_server.settings.config import ServerConfig
from kcoral_server.storage.workspace import CapturedOutput
from raw_http import execute_body

from kcoral.protocol.request import parse_execute_request

RUNTIME_ERROR = {
    "kind": "runtime",
    "message": "boom",
    "instruction_index": 3,
    "instruction_op": "run",
    "instruction_id": "r",
    "traceback": "",
}


def outcome(status: str, error: dict | None = None) -> ProgramOutcome:
    output = CapturedOutput("", "", False, False)
    return ProgramOutcome(status, error, [], output, 0.0, 0.0, 0.0, "completed", [])


def test_an_empty_record_has_no_fields() -> None:
    assert RequestRecord().fields() == {}


def test_a_finished_program_is_logged_with_its_seat_times_and_error() -> None:
    record = RequestRecord(timeout_seconds=30.0)
    record.seat = SeatAssignment("cpu:0", None, 1.5)
    record.times = RunTimes(elapsed_ms=12.0, lease_wait_ms=0.0, lease_held_ms=0.0)
    record.answered(outcome("FAILED", RUNTIME_ERROR))
    assert record.fields() == {
        "timeout_seconds": 30.0,
        "worker_id": "cpu:0",
        "gpu_id": None,
        "queue_ms": 1.5,
        "status": "FAILED",
        "error_kind": "runtime",
        "error_message": "boom",
        "instruction_index": 3,
        "instruction_op": "run",
        "instruction_id": "r",
        "elapsed_ms": 12.0,
        "lease_wait_ms": 0.0,
        "lease_held_ms": 0.0,
    }


def test_a_failure_after_a_failed_program_keeps_the_programs_error_and_adds_its_detail() -> None:
    record = RequestRecord()
    record.answered(outcome("FAILED", RUNTIME_ERROR))
    record.failed(RequestFailed(500, "engine", "later", "server_error", error_detail="why"))
    fields = record.fields()
    assert (fields["error_kind"], fields["error_message"], fields["error_detail"]) == (
        "runtime",
        "boom",
        "why",
    )


def test_a_refused_request_is_logged_with_the_refusals_kind_and_message() -> None:
    record = RequestRecord()
    record.failed(SATURATED.failure())
    assert record.fields() == {"error_kind": "busy", "error_message": "server saturated"}


def test_an_unhandled_fault_is_logged_with_its_type_and_the_end_of_its_traceback() -> None:
    record = RequestRecord()
    record.faulted(KeyError("k"), "x" * 10_000)
    fields = record.fields()
    assert fields["error_kind"] == "engine" and fields["error_message"] == "KeyError: 'k'"
    assert len(fields["traceback"]) == 8192


def test_the_saturated_refusal_is_the_documented_503() -> None:
    failure = SATURATED.failure()
    assert (failure.status, failure.kind, failure.message, failure.reason) == (
        503,
        "busy",
        "server saturated",
        "no_worker",
    )


def admitted(options: dict, config: ServerConfig) -> AdmittedProgram:
    document = {"instructions": [{"op": "upload", "id": "m", "kind": "module", "source": ""}]}
    content_type, body = execute_body({**document, "options": options})
    parsed = parse_execute_request(content_type, memoryview(body))
    return AdmittedProgram.under(parsed, Resolution({}, [], []), config)


def test_a_program_gets_the_default_deadline_and_output_limit_unless_it_asks() -> None:
    config = ServerConfig(default_timeout_seconds=30, output_limit_bytes=1000)
    plain = admitted({}, config)
    assert (plain.timeout, plain.output_limit) == (30.0, 1000)
    asked = admitted({"timeout_seconds": 5, "output_limit_bytes": 10}, config)
    assert (asked.timeout, asked.output_limit) == (5.0, 10)


def test_a_program_never_gets_more_than_the_servers_maximums() -> None:
    config = ServerConfig(max_timeout_seconds=60, max_output_limit_bytes=100)
    greedy = admitted({"timeout_seconds": 600, "output_limit_bytes": 10_000}, config)
    assert (greedy.timeout, greedy.output_limit) == (60.0, 100)
