"""``/execute`` request rejections of PROTOCOL.md §3.2 rows 2–11, 13 and 14."""

from __future__ import annotations

import hashlib
import json

import pytest

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.request import (
    check_tensor_lengths,
    parse_execute_request,
    verify_blob_hashes,
)
from kcoral.protocol.validate import parse_program

TENSOR = bytes(range(16))
TEXT = b"hello\n"
HT = hashlib.sha256(TENSOR).hexdigest()
HF = hashlib.sha256(TEXT).hexdigest()
PROGRAM = {
    "instructions": [
        {"op": "upload", "id": "x", "kind": "tensor", "dtype": "float32", "shape": [4], "blob": HT},
        {"op": "upload", "kind": "file", "path": "a.txt", "blob": HF},
        {"op": "return", "key": "x", "value": {"$ref": "x"}},
    ]
}
PROGRAM_JSON = json.dumps(PROGRAM).encode()
JSON = "application/json"
OCTETS = "application/octet-stream"


def request(parts: list[tuple[str, str, bytes]]) -> tuple[str, memoryview]:
    content_type, chunks, _ = encode_multipart(parts)
    return content_type, memoryview(b"".join(chunks))


def good_parts() -> list[tuple[str, str, bytes]]:
    return [
        ("program", JSON, PROGRAM_JSON),
        (f"blob:{HF}", OCTETS, TEXT),
        (f"blob:{HT}", OCTETS, TENSOR),
    ]


def rejects(content_type: str | None, body: memoryview, fragment: str = "") -> str:
    with pytest.raises(ValidationError) as info:
        parse_execute_request(content_type, body)
    assert fragment in str(info.value), str(info.value)
    return str(info.value)


def test_a_valid_request_yields_program_bytes_and_blobs_in_part_order() -> None:
    content_type, body = request(good_parts())
    parsed = parse_execute_request(content_type, body)
    assert parsed.program == parse_program(PROGRAM)
    assert bytes(parsed.program_bytes) == PROGRAM_JSON
    assert list(parsed.blobs) == [HF, HT]
    assert bytes(parsed.blobs[HT]) == TENSOR
    assert parsed.blobs[HT].obj is body.obj  # zero copy


def test_a_program_without_blob_parts_is_valid() -> None:
    content_type, body = request([("program", JSON, PROGRAM_JSON)])
    assert parse_execute_request(content_type, body).blobs == {}


def test_row_2_a_request_that_is_not_multipart_form_data_is_rejected() -> None:
    _, body = request(good_parts())
    rejects("application/json", body, "multipart/form-data")
    rejects(None, body)
    rejects("multipart/form-data", body, "boundary")


def test_row_3_a_body_without_its_closing_delimiter_is_rejected() -> None:
    content_type, body = request(good_parts())
    cut = bytes(body)[: bytes(body).rindex(b"--kcoral")]
    rejects(content_type, memoryview(cut), "closing delimiter")


def test_row_3_a_part_with_two_content_types_is_rejected() -> None:
    content_type, body = request(good_parts())
    doubled = bytes(body).replace(
        b"Content-Type: application/json\r\n", b"Content-Type: application/json\r\n" * 2, 1
    )
    rejects(content_type, memoryview(doubled), "Content-Type")


def test_row_4_an_unknown_part_name_is_rejected() -> None:
    for name in ["programme", "blob:" + HT.upper(), "blob:" + HT[:-1], "result", "blob:"]:
        content_type, body = request([*good_parts(), (name, OCTETS, b"")])
        rejects(content_type, body, "unexpected part name")


def test_row_5_exactly_one_program_part_is_required() -> None:
    content_type, body = request(good_parts()[1:])
    rejects(content_type, body, "got 0")
    content_type, body = request([*good_parts(), ("program", JSON, PROGRAM_JSON)])
    rejects(content_type, body, "got 2")


def test_row_6_the_program_part_must_be_json() -> None:
    content_type, body = request([("program", "text/plain", PROGRAM_JSON)])
    rejects(content_type, body, "'program' part has type")


def test_row_6_program_media_type_is_compared_case_insensitively_without_parameters() -> None:
    content_type, body = request([("program", "Application/JSON; charset=utf-8", PROGRAM_JSON)])
    assert parse_execute_request(content_type, body).program == parse_program(PROGRAM)


def test_row_7_blob_parts_must_be_octet_streams() -> None:
    content_type, body = request([good_parts()[0], (f"blob:{HF}", "text/plain", TEXT)])
    rejects(content_type, body, "expected application/octet-stream")


def test_row_8_a_blob_part_may_not_repeat() -> None:
    content_type, body = request([*good_parts(), (f"blob:{HF}", OCTETS, TEXT)])
    rejects(content_type, body, "duplicate blob part")


def test_row_9_a_blob_part_with_a_wrong_hash_is_rejected() -> None:
    content_type, body = request([good_parts()[0], (f"blob:{HF}", OCTETS, TEXT + b"!")])
    rejects(content_type, body, "SHA-256")


def test_row_9_can_be_deferred_to_the_caller() -> None:
    parts = [good_parts()[0], (f"blob:{HF}", OCTETS, TEXT + b"!")]
    content_type, body = request(parts)
    parsed = parse_execute_request(content_type, body, verify_hashes=False)
    with pytest.raises(ValidationError, match="SHA-256"):
        verify_blob_hashes(parsed.blobs)
    verify_blob_hashes({HF: TEXT, HT: memoryview(TENSOR)})


@pytest.mark.parametrize(
    "program",
    [
        b"\xff{}",
        b"{",
        b'{"instructions": [], "instructions": []}',
        b'{"instructions": [{"op": "run", "op": "run"}]}',
        b'{"options": {"timeout_seconds": NaN}, "instructions": []}',
        b"[Infinity]",
        b"-Infinity",
        b"[]",
        b"null",
        b"1" * 5000,
    ],
)
def test_row_10_program_json_must_be_strict_utf8_json_with_an_object_at_the_top(
    program: bytes,
) -> None:
    content_type, body = request([("program", JSON, program)])
    rejects(content_type, body, "program: ")


def test_row_11_a_schema_violation_names_the_instruction() -> None:
    bad = {"instructions": [{"op": "run", "id": "y", "fn": {"$ref": "x"}}]}
    content_type, body = request([("program", JSON, json.dumps(bad).encode())])
    assert rejects(content_type, body) == "instruction 0: unknown or forward reference 'x'"


def test_row_13_an_unreferenced_blob_part_is_rejected() -> None:
    extra = b"nobody wants me"
    name = f"blob:{hashlib.sha256(extra).hexdigest()}"
    content_type, body = request([*good_parts(), (name, OCTETS, extra)])
    rejects(content_type, body, "not referenced by any upload")


def test_checks_run_in_row_order() -> None:
    # Wrong hash (row 9) and invalid JSON (row 10): row 9 is reported.
    content_type, body = request([("program", JSON, b"{"), (f"blob:{HF}", OCTETS, b"x")])
    rejects(content_type, body, "SHA-256")
    # Invalid schema (row 11) and unreferenced blob (row 13): row 11 is reported.
    bad = json.dumps({"instructions": [{"op": "x"}]}).encode()
    content_type, body = request([("program", JSON, bad), (f"blob:{HF}", OCTETS, TEXT)])
    rejects(content_type, body, "instruction 0")


def test_row_14_tensor_lengths_are_checked_for_available_bytes_only() -> None:
    program = parse_program(PROGRAM)
    check_tensor_lengths(program, {HT: TENSOR})
    check_tensor_lengths(program, {})  # missing bytes are a cache miss, not a 400
    check_tensor_lengths(program, {HF: b"x"})  # file uploads have no length rule
    with pytest.raises(ValidationError, match="instruction 0: tensor data is 15 bytes"):
        check_tensor_lengths(program, {HT: memoryview(TENSOR)[1:]})


def test_row_14_counts_zero_size_and_scalar_shapes() -> None:
    upload = {"op": "upload", "id": "s", "kind": "tensor", "dtype": "int64", "blob": HT}
    scalar = parse_program({"instructions": [{**upload, "shape": []}]})
    empty = parse_program({"instructions": [{**upload, "shape": [3, 0]}]})
    check_tensor_lengths(scalar, {HT: b"\0" * 8})
    check_tensor_lengths(empty, {HT: b""})
    with pytest.raises(ValidationError):
        check_tensor_lengths(empty, {HT: b"\0"})
