"""Strict validation of 200 answers (CLIENT_API.md §10): every broken rule is a ProtocolError."""

from __future__ import annotations

import copy
import hashlib
import json

import ml_dtypes
import numpy as np
import pytest

from kcoral import Client, Program
from kcoral.errors import ProtocolError
from kcoral.protocol.multipart import encode_multipart
from kcoral.response import CacheMiss, decode_execute_response
from kcoral.results import ReturnedFile, ReturnedFolder

H = hashlib.sha256(b"data").hexdigest()
JSON = "application/json"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def base(**extra):
    body = {
        "status": "COMPLETED",
        "request_id": "r-1",
        "queue_ms": 0,
        "elapsed_ms": 1.5,
        "lease_wait_ms": 0,
        "lease_held_ms": 0,
        "stdout": "",
        "stderr": "",
        "results": {},
    }
    body.update(extra)
    return body


def failed(**error_extra):
    error = {
        "kind": "runtime",
        "message": "ZeroDivisionError: division by zero",
        "instruction_index": 2,
        "instruction_op": "run",
        "instruction_id": "bad",
        "traceback": "",
    }
    error.update(error_extra)
    return base(status="FAILED", error={k: v for k, v in error.items() if v is not ...})


def multipart(result, *binaries, result_type=JSON, names=None):
    parts = [("result", result_type, json.dumps(result).encode())]
    for i, data in enumerate(binaries):
        name = names[i] if names else f"return:{i}"
        parts.append((name, "application/octet-stream", data))
    content_type, chunks, _ = encode_multipart(parts)
    return content_type, b"".join(bytes(chunk) for chunk in chunks)


def decode(body, content_type=JSON, known=(H,)):
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return decode_execute_response(content_type, body, known)


def node_bytes(part="return:0", data=b"x"):
    return {"type": "bytes", "part": part, "sha256": sha(data)}


def file_node(part, data):
    return {"type": "file", "size": len(data), "part": part, "sha256": sha(data)}


# -- valid answers --------------------------------------------------------------------------


def test_a_plain_json_answer_decodes_every_scalar_and_container():
    results = {
        "n": {"type": "null"},
        "b": {"type": "boolean", "value": True},
        "i": {"type": "integer", "value": 7},
        "f": {"type": "number", "value": 3},
        "s": {"type": "string", "value": "t"},
        "a": {"type": "array", "value": [{"type": "integer", "value": 1}]},
        "o": {"type": "object", "value": {"z": {"type": "null"}, "a": {"type": "null"}}},
    }
    result = decode(base(results=results, stdout_truncated=True))
    assert result.results == {
        "n": None,
        "b": True,
        "i": 7,
        "f": 3.0,
        "s": "t",
        "a": [1],
        "o": {"z": None, "a": None},
    }
    assert list(result.results["o"]) == ["z", "a"]
    assert isinstance(result["f"], float)
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.error is None and result.gpu_ids == ()


def test_nested_binaries_are_numbered_depth_first_and_folders_decode():
    a, b, c = b"a", b"bb", b"ccc"
    results = {
        "arr": {"type": "array", "value": [node_bytes("return:0", a), node_bytes("return:1", b)]},
        "dir": {
            "type": "folder",
            "files": {"d/x.txt": file_node("return:2", c)},
            "directories": ["d", "empty"],
        },
    }
    content_type, body = multipart(base(results=results), a, b, c)
    result = decode(body, content_type)
    assert result["arr"] == [a, b]
    folder = result["dir"]
    assert isinstance(folder, ReturnedFolder)
    assert folder.files == {"d/x.txt": ReturnedFile(c)} and folder.directories == ("d", "empty")


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "bool", "int16"])
def test_tensors_decode_to_writable_owning_arrays_with_ml_dtypes(dtype):
    numpy_type = getattr(ml_dtypes, dtype, None) or np.dtype(dtype)
    array = np.ones((2, 3), dtype=numpy_type)
    raw = array.tobytes()
    node = {
        "type": "tensor",
        "dtype": dtype,
        "shape": [2, 3],
        "part": "return:0",
        "sha256": sha(raw),
    }
    content_type, body = multipart(base(results={"t": node}), raw)
    out = decode(body, content_type)["t"]
    assert out.dtype == np.dtype(numpy_type) and out.shape == (2, 3)
    assert out.flags.writeable and out.flags.owndata
    assert out.tobytes() == raw


def test_a_failed_answer_keeps_its_error_and_gpu_ids():
    body = failed()
    body.update(gpu_ids=[3, 1], gpu_count=2)
    result = decode(body)
    assert result.status == "FAILED" and not result.completed
    assert result.error["kind"] == "runtime" and result.gpu_ids == (3, 1)


def test_a_gpu_access_error_carries_its_three_extra_fields():
    body = failed(
        kind="gpu_access", cuda_call="cudaMalloc", location="f:1 in g", interfered_request_id=None
    )
    assert decode(body).error["cuda_call"] == "cudaMalloc"


def test_a_cache_miss_is_returned_for_the_negotiation():
    miss = decode({"status": "CACHE_MISS", "request_id": "r", "missing_blobs": [H]})
    assert miss == CacheMiss("r", (H,))


# -- the table of broken answers --------------------------------------------------------------


def _broken_json_cases():
    def with_(**extra):
        return base(**extra)

    def without(key):
        body = base()
        del body[key]
        return body

    def error_without(key):
        body = failed()
        del body["error"][key]
        return body

    cases = {
        "status unknown": with_(status="DONE"),
        "status ERROR on 200": with_(status="ERROR"),
        "request_id empty": with_(request_id=""),
        "request_id missing": without("request_id"),
        "timing is a bool": with_(queue_ms=True),
        "timing missing": without("lease_held_ms"),
        "timing is a string": with_(elapsed_ms="1"),
        "timing overflows": with_(elapsed_ms=10**400),
        "stdout not a string": with_(stdout=None),
        "stderr missing": without("stderr"),
        "truncation flag not bool": with_(stderr_truncated=0),
        "gpu_ids without gpu_count": with_(gpu_ids=[0]),
        "gpu_count without gpu_ids": with_(gpu_count=1),
        "gpu_ids empty": with_(gpu_ids=[], gpu_count=0),
        "gpu_ids repeated": with_(gpu_ids=[1, 1], gpu_count=2),
        "gpu_ids negative": with_(gpu_ids=[-1], gpu_count=1),
        "gpu_ids bool": with_(gpu_ids=[True], gpu_count=1),
        "gpu_ids too many": with_(gpu_ids=list(range(9)), gpu_count=9),
        "gpu_count wrong": with_(gpu_ids=[0, 1], gpu_count=1),
        "gpu_count bool": with_(gpu_ids=[0], gpu_count=True),
        "results not object": with_(results=[]),
        "results missing": without("results"),
        "node not object": with_(results={"k": 1}),
        "node type unknown": with_(results={"k": {"type": "complex", "value": 1}}),
        "node extra field": with_(results={"k": {"type": "null", "value": None}}),
        "node missing value": with_(results={"k": {"type": "integer"}}),
        "integer is bool": with_(results={"k": {"type": "integer", "value": False}}),
        "integer is float": with_(results={"k": {"type": "integer", "value": 1.5}}),
        "number is bool": with_(results={"k": {"type": "number", "value": True}}),
        "number is string": with_(results={"k": {"type": "number", "value": "1"}}),
        "boolean is int": with_(results={"k": {"type": "boolean", "value": 1}}),
        "string is int": with_(results={"k": {"type": "string", "value": 1}}),
        "array is object": with_(results={"k": {"type": "array", "value": {}}}),
        "object is array": with_(results={"k": {"type": "object", "value": []}}),
        "nested node broken": with_(
            results={"k": {"type": "array", "value": [{"type": "integer", "value": "1"}]}}
        ),
        "binary node in a JSON body": with_(results={"k": node_bytes()}),
        "COMPLETED with error": with_(error=failed()["error"]),
        "COMPLETED with null error": with_(error=None),
        "FAILED without error": with_(status="FAILED"),
        "error unknown kind": failed(kind="oops"),
        "error extra field": failed(extra="x"),
        "error missing traceback": error_without("traceback"),
        "error index is bool": failed(instruction_index=True),
        "error index is string": failed(instruction_index="2"),
        "error op unknown": failed(instruction_op="call"),
        "error id is int": failed(instruction_id=3),
        "error message not string": failed(message=None),
        "gpu_access fields without gpu_access": failed(
            cuda_call="x", location="y", interfered_request_id=None
        ),
        "gpu_access without its fields": failed(kind="gpu_access"),
        "gpu_access interfered id int": failed(
            kind="gpu_access", cuda_call="c", location="l", interfered_request_id=1
        ),
        "cache miss empty": {"status": "CACHE_MISS", "request_id": "r", "missing_blobs": []},
        "cache miss not list": {"status": "CACHE_MISS", "request_id": "r", "missing_blobs": H},
        "cache miss duplicate": {
            "status": "CACHE_MISS",
            "request_id": "r",
            "missing_blobs": [H, H],
        },
        "cache miss upper hex": {
            "status": "CACHE_MISS",
            "request_id": "r",
            "missing_blobs": [H.upper()],
        },
        "cache miss unknown blob": {
            "status": "CACHE_MISS",
            "request_id": "r",
            "missing_blobs": ["0" * 64],
        },
        "cache miss no request id": {"status": "CACHE_MISS", "missing_blobs": [H]},
        "top level array": [],
    }
    return cases


@pytest.mark.parametrize("case", sorted(_broken_json_cases()))
def test_a_broken_json_answer_is_a_protocol_error(case):
    with pytest.raises(ProtocolError):
        decode(_broken_json_cases()[case])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"status":"COMPLETED","status":"COMPLETED"}',
        b'{"status":"COMPLETED","queue_ms":NaN}',
        b"\xff\xfe",
        b"not json",
        b"",
    ],
    ids=["duplicate key", "NaN", "bad utf-8", "not json", "empty"],
)
def test_invalid_json_text_is_a_protocol_error(raw):
    with pytest.raises(ProtocolError):
        decode(raw)


def _broken_multipart_cases():
    x = b"x"
    ok = base(results={"k": node_bytes("return:0", x)})

    def bad_node(**changes):
        node = node_bytes("return:0", x)
        node.update(changes)
        return multipart(base(results={"k": node}), x)

    def tensor(dtype="float32", shape=(1,), data=b"\0\0\0\0"):
        node = {
            "type": "tensor",
            "dtype": dtype,
            "shape": list(shape),
            "part": "return:0",
            "sha256": sha(data),
        }
        return multipart(base(results={"k": node}), data)

    def folder(files, directories):
        nodes = {p: file_node(f"return:{i}", b"f") for i, p in enumerate(files)}
        node = {"type": "folder", "files": nodes, "directories": directories}
        return multipart(base(results={"k": node}), *([b"f"] * len(files)))

    two = base(results={"a": node_bytes("return:0", x), "b": node_bytes("return:1", x)})
    return {
        "wrong sha256": bad_node(sha256="0" * 64),
        "part name not canonical": bad_node(part="return:00"),
        "part out of order": multipart(
            base(results={"a": node_bytes("return:1", x), "b": node_bytes("return:0", x)}), x, x
        ),
        "part referenced twice": multipart(
            base(results={"a": node_bytes("return:0", x), "b": node_bytes("return:0", x)}), x
        ),
        "part missing": multipart(two, x),
        "part unreferenced": multipart(ok, x, x),
        "odd part name": multipart(ok, x, x, names=["return:0", "extra"]),
        "duplicate part": multipart(two, x, x, names=["return:0", "return:0"]),
        "result not json type": multipart(ok, x, result_type="text/plain"),
        "no result part": (
            "multipart/form-data; boundary=b",
            b'--b\r\nContent-Disposition: form-data; name="a"\r\n'
            b"Content-Type: application/octet-stream\r\n\r\nx\r\n--b--\r\n",
        ),
        "tensor unknown dtype": tensor(dtype="complex64"),
        "tensor negative shape": tensor(shape=(-1,)),
        "tensor bool shape": tensor(shape=(True,)),
        "tensor wrong length": tensor(shape=(2,)),
        "file size wrong": multipart(
            base(results={"k": {"type": "file", "size": 2, "part": "return:0", "sha256": sha(x)}}),
            x,
        ),
        "file size bool": multipart(
            base(
                results={"k": {"type": "file", "size": True, "part": "return:0", "sha256": sha(x)}}
            ),
            x,
        ),
        "folder unsorted": folder(["b", "a"], []),
        "folder not canonical": folder(["./a"], []),
        "folder parent unlisted": folder(["d/a"], []),
        "folder file is directory": folder(["d"], ["d"]),
        "folder directories unsorted": folder([], ["b", "a"]),
        "folder entry not a file": multipart(
            base(
                results={
                    "k": {
                        "type": "folder",
                        "files": {"a": node_bytes("return:0", x)},
                        "directories": [],
                    }
                }
            ),
            x,
        ),
        "cache miss as multipart": multipart(
            {"status": "CACHE_MISS", "request_id": "r", "missing_blobs": [H]}
        ),
    }


@pytest.mark.parametrize("case", sorted(_broken_multipart_cases()))
def test_a_broken_multipart_answer_is_a_protocol_error(case):
    content_type, body = _broken_multipart_cases()[case]
    with pytest.raises(ProtocolError):
        decode(body, content_type)


@pytest.mark.parametrize("content_type", [None, "text/plain", "multipart/form-data", "text/json"])
def test_an_unexpected_content_type_is_a_protocol_error(content_type):
    with pytest.raises(ProtocolError):
        decode(base(), content_type)


def test_a_malformed_answer_from_a_server_raises_protocol_error(canned_server):
    broken = copy.deepcopy(base())
    broken["queue_ms"] = None
    canned_server.add(broken)
    with pytest.raises(ProtocolError):
        Client(canned_server.url).execute(Program())
