"""The shared /execute negotiation state machine, fed canned answers (no I/O)."""

from __future__ import annotations

import json

import pytest

import kcoral
from kcoral.connection.negotiation import Attempt, ExecuteNegotiation, execute_body
from kcoral.errors import KCoralError, ProtocolError

RESULT = {
    "status": "COMPLETED", "request_id": "r", "queue_ms": 0, "elapsed_ms": 1,
    "lease_wait_ms": 0, "lease_held_ms": 0, "results": {}, "stdout": "", "stderr": "",
    "stdout_truncated": False, "stderr_truncated": False,
}  # fmt: skip


def two_blob_program() -> tuple[kcoral.Program, list[str]]:
    program = kcoral.Program()
    program.upload(kind="bytes", value=b"first")
    program.upload(kind="bytes", value=b"second")
    return program, list(program.blobs)


def miss(*hashes: str) -> bytes:
    return json.dumps(
        {"status": "CACHE_MISS", "request_id": "m", "missing_blobs": list(hashes)}
    ).encode()


def blob_names(attempt: Attempt) -> list[str]:
    body = attempt.body()
    return [
        h
        for h in (
            line.split(b'name="blob:')[-1][:64].decode()
            for line in body.split(b"\r\n")
            if b'name="blob:' in line
        )
    ]


def test_the_first_attempt_sends_no_blobs_and_the_second_exactly_the_missing_ones() -> None:
    program, (first, second) = two_blob_program()
    negotiation = ExecuteNegotiation(program)
    attempt = negotiation.first_attempt()
    assert blob_names(attempt) == []
    retry = negotiation.handle_response(200, {}, "application/json", miss(second))
    assert isinstance(retry, Attempt) and blob_names(retry) == [second]
    last = negotiation.handle_response(200, {}, "application/json", miss(second))
    assert blob_names(last) == [first, second]
    with pytest.raises(ProtocolError):
        negotiation.handle_response(200, {}, "application/json", miss(second))


def test_the_node_header_of_the_previous_answer_is_echoed() -> None:
    program, (first, _) = two_blob_program()
    negotiation = ExecuteNegotiation(program, headers={"X-KCoral-Node": "stale", "A": "b"})
    assert "X-KCoral-Node" not in negotiation.first_attempt().headers
    retry = negotiation.handle_response(
        200, {"X-KCoral-Node": "node-1"}, "application/json", miss(first)
    )
    assert retry.headers["X-KCoral-Node"] == "node-1" and retry.headers["A"] == "b"
    last = negotiation.handle_response(
        200, {"X-KCoral-Node": "n" * 513}, "application/json", miss(first)
    )
    assert "X-KCoral-Node" not in last.headers


def test_the_program_json_is_identical_on_every_attempt() -> None:
    program, (first, _) = two_blob_program()
    negotiation = ExecuteNegotiation(program, timeout_seconds=2.5)
    body = negotiation.first_attempt().body()
    retry = negotiation.handle_response(200, {}, "application/json", miss(first))
    program_part = execute_body(program, timeout_seconds=2.5)
    assert program_part in body and program_part in retry.body()


def test_a_completed_answer_is_the_result() -> None:
    program, _ = two_blob_program()
    negotiation = ExecuteNegotiation(program)
    negotiation.first_attempt()
    result = negotiation.handle_response(200, {}, "application/json", json.dumps(RESULT).encode())
    assert isinstance(result, kcoral.ProgramResult) and result.completed


def test_an_error_answer_is_a_kcoral_error() -> None:
    negotiation = ExecuteNegotiation(two_blob_program()[0])
    negotiation.first_attempt()
    body = json.dumps(
        {"status": "ERROR", "request_id": "e", "error": {"kind": "parse", "message": "no"}}
    )
    with pytest.raises(KCoralError) as info:
        negotiation.handle_response(400, {}, "application/json", body.encode())
    assert (info.value.status_code, info.value.kind, info.value.message) == (400, "parse", "no")


def test_the_serialization_header_is_sent_and_checked() -> None:
    negotiation = ExecuteNegotiation(
        two_blob_program()[0], headers={"x-kcoral-serialization": "json"}, serialization="pickle"
    )
    headers = negotiation.first_attempt().headers
    assert headers["X-KCoral-Serialization"] == "pickle"
    assert "x-kcoral-serialization" not in headers
    with pytest.raises(ValueError):
        ExecuteNegotiation(two_blob_program()[0], serialization="yaml")


@pytest.mark.parametrize(
    ("options", "error"),
    [({"gpu_count": 0}, ValueError), ({"gpu_count": True}, ValueError),
     ({"timeout_seconds": float("nan")}, ValueError)],
)  # fmt: skip
def test_invalid_options_fail_before_any_request(options, error) -> None:
    with pytest.raises(error):
        ExecuteNegotiation(two_blob_program()[0], **options)
    with pytest.raises(TypeError):
        ExecuteNegotiation("not a program")  # type: ignore[arg-type]
