"""What an answer body looks like (PROTOCOL §7, §9, CLIENT_API §8): compact JSON,
traceback tails, instruction ids in errors, part numbering, value snapshots, plain-JSON
answers, and the error a client raises.

Moved from the conformance audit of the core against the specs (each test pins one
normative statement no other test did).
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import (
    RESULT_FIELDS,
    execute_raw,
    is_canonical_uuid,
    sha256,
)

import kcoral


def module_upload(source: str) -> dict[str, Any]:
    return {"op": "upload", "kind": "module", "id": "m", "source": source}


def call_and_return(name: str, key: str = "out") -> list[dict[str, Any]]:
    return [
        {"op": "get_function", "id": name, "module": {"$ref": "m"}, "name": name},
        {"op": "run", "id": f"{name}_out", "fn": {"$ref": name}},
        {"op": "return", "key": key, "value": {"$ref": f"{name}_out"}},
    ]


def divide(a, b):
    return a / b


def test_response_json_is_compact_and_keeps_non_ascii_characters(e2e_server):
    source = "def f():\n    print('h\\u00e9llo \\u2713')\n    return '\\u00fcn\\u00ef \\u2713'\n"
    response = execute_raw(
        e2e_server.url, {"instructions": [module_upload(source), *call_and_return("f")]}
    )
    assert response.status == 200 and response.headers["Content-Type"] == "application/json"
    assert "ünï ✓".encode() in response.raw and "héllo ✓".encode() in response.raw
    assert b"\\u" not in response.raw
    assert b'", "' not in response.raw and b'": ' not in response.raw
    assert response.body["results"]["out"] == {"type": "string", "value": "ünï ✓"}


def test_a_traceback_longer_than_8192_characters_keeps_its_last_8192(e2e_server):
    source = "def f():\n    raise ValueError('x' * 20000 + 'END')\n"
    response = execute_raw(
        e2e_server.url, {"instructions": [module_upload(source), *call_and_return("f")]}
    )
    error = response.body["error"]
    assert error["message"] == "ValueError: " + "x" * 20000 + "END"  # messages are not cut
    assert len(error["traceback"]) == 8192
    assert error["traceback"].rstrip("\n").endswith("xxxEND")


def test_a_failed_file_upload_without_id_reports_a_null_instruction_id(e2e_server):
    data = b"q"
    source = "import os\nos.mkdir('d')\nopen('d/x', 'w').close()\n"
    document = {
        "instructions": [
            module_upload(source),
            {"op": "upload", "kind": "file", "path": "d/x", "blob": sha256(data)},
        ]
    }
    response = execute_raw(e2e_server.url, document, {sha256(data): data})
    assert response.body["status"] == "FAILED"
    error = response.body["error"]
    assert (error["kind"], error["instruction_index"]) == ("runtime", 1)
    assert error["instruction_op"] == "upload" and error["instruction_id"] is None


def test_a_failing_return_rolls_back_its_parts_and_keeps_numbering_contiguous(e2e_server):
    source = "def g():\n    return b'first'\ndef h():\n    return [b'rolled back', object()]\n"
    document = {
        "instructions": [
            module_upload(source),
            *call_and_return("g", "a"),
            *call_and_return("h", "b"),
        ]
    }
    response = execute_raw(e2e_server.url, document)
    assert response.status == 200 and response.body["status"] == "FAILED"
    assert response.body["error"]["kind"] == "serialization"
    assert response.body["results"] == {
        "a": {"type": "bytes", "part": "return:0", "sha256": sha256(b"first")}
    }
    assert response.part_order == ["result", "return:0"]
    assert response.parts == {"return:0": b"first"}


def test_a_value_return_snapshots_the_value_when_it_runs(e2e_server):
    source = "x = [1]\ndef get():\n    return x\ndef grow():\n    x.append(2)\n"
    document = {
        "instructions": [
            module_upload(source),
            {"op": "get_function", "id": "get", "module": {"$ref": "m"}, "name": "get"},
            {"op": "get_function", "id": "grow", "module": {"$ref": "m"}, "name": "grow"},
            {"op": "run", "id": "x", "fn": {"$ref": "get"}},
            {"op": "return", "key": "before", "value": {"$ref": "x"}},
            {"op": "run", "id": "grown", "fn": {"$ref": "grow"}},
            {"op": "return", "key": "after", "value": {"$ref": "x"}},
        ]
    }
    results = execute_raw(e2e_server.url, document).body["results"]
    assert list(results) == ["before", "after"]
    assert results["before"]["value"] == [{"type": "integer", "value": 1}]
    assert len(results["after"]["value"]) == 2


def test_an_empty_folder_return_alone_keeps_the_answer_plain_json(e2e_server):
    document = {
        "instructions": [
            module_upload("import os\nos.mkdir('empty')\n"),
            {"op": "return", "key": "f", "kind": "folder", "path": "empty"},
        ]
    }
    response = execute_raw(e2e_server.url, document)
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.body) == RESULT_FIELDS
    assert response.body["results"] == {"f": {"type": "folder", "files": {}, "directories": []}}


def test_get_function_on_a_bytes_handle_is_unavailable_on_a_cpu_server(e2e_server):
    data = b"not a module"
    document = {
        "instructions": [
            {"op": "upload", "kind": "bytes", "id": "b", "blob": sha256(data)},
            {"op": "get_function", "id": "f", "module": {"$ref": "b"}, "name": "f"},
        ]
    }
    error = execute_raw(e2e_server.url, document, {sha256(data): data}).body["error"]
    assert (error["kind"], error["instruction_op"], error["instruction_id"]) == (
        "unavailable",
        "get_function",
        "f",
    )


def test_remote_execution_error_names_the_request_kind_and_message(client):
    remote = client.function()(divide)
    with pytest.raises(kcoral.RemoteExecutionError) as caught:
        remote.remote(1, 0)
    result = caught.value.result
    assert result.status == "FAILED" and is_canonical_uuid(result.request_id)
    assert str(caught.value) == (
        f"Remote execution {result.request_id} failed: runtime: ZeroDivisionError: division by zero"
    )


# ---------------------------------------------------------------- jobs (EXTENSIONS §5)
