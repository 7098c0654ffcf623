"""CPU-mode tensor uploads and returns (EXTENSIONS §2); these workers import torch."""

from __future__ import annotations

import hashlib
import struct

import ml_dtypes
import numpy as np
import pytest
from worker_harness import blob, blocking_env, call, function, give, module, ref

pytestmark = pytest.mark.slow  # importing torch takes seconds

DESCRIBE = (
    "def describe(t):\n"
    "    return [type(t).__module__.split('.')[0], str(t.dtype), list(t.shape)]\n"
    "def double(t):\n    return t * 2\n"
    "def writable(t):\n"
    "    try:\n        t[0] = 0\n    except (ValueError, RuntimeError):\n        return False\n"
    "    return True\n"
)


def tensor_upload(ident: str, sha: str, dtype: str, shape: list[int]) -> dict:
    return {
        "op": "upload",
        "kind": "tensor",
        "id": ident,
        "blob": sha,
        "dtype": dtype,
        "shape": shape,
    }


def test_tensors_become_cpu_torch_tensors_and_return_as_tensor_nodes(shared_worker):
    sha, data = blob(struct.pack("<4f", 1, 2, 3, 4))
    bf_sha, bf_data = blob(np.array([1.5, -2], dtype=ml_dtypes.bfloat16).tobytes())
    result = shared_worker.run(
        [
            tensor_upload("x", sha, "float32", [2, 2]),
            tensor_upload("h", bf_sha, "bfloat16", [2]),
            module("m", DESCRIBE),
            function("describe", "m", "describe"),
            function("double", "m", "double"),
            call("d", "describe", ref("x")),
            call("y", "double", ref("x")),
            give("d", "d"),
            give("y", "y"),
            give("h", "h"),
        ],
        [(sha, data), (bf_sha, bf_data)],
    )
    assert result.finished.status == "COMPLETED", result.error
    assert [n["value"] for n in result.value("d")["value"][:2]] == ["torch", "torch.float32"]
    node, parts = result.returns["y"]
    expected = struct.pack("<4f", 2, 4, 6, 8)
    assert node == {
        "type": "tensor",
        "dtype": "float32",
        "shape": [2, 2],
        "part": "return:0",
        "sha256": hashlib.sha256(expected).hexdigest(),
    }
    assert parts == [expected]
    assert result.value("h")["dtype"] == "bfloat16"
    assert result.returns["h"][1] == [bf_data]


def test_scalar_and_empty_tensors_are_accepted(shared_worker):
    sha, data = blob(struct.pack("<q", 7))
    empty_sha, empty = blob(b"")
    result = shared_worker.run(
        [
            tensor_upload("s", sha, "int64", []),
            tensor_upload("e", empty_sha, "float16", [0, 3]),
            give("s", "s"),
            give("e", "e"),
        ],
        [(sha, data), (empty_sha, empty)],
    )
    assert result.finished.status == "COMPLETED", result.error
    assert result.value("s")["shape"] == []
    assert result.value("e")["shape"] == [0, 3]
    assert result.returns["e"][1] == [b""]


def test_a_tensor_with_the_wrong_byte_length_is_a_malformed_tensor(shared_worker):
    sha, data = blob(b"\x00" * 6)
    result = shared_worker.run([tensor_upload("x", sha, "float32", [2])], [(sha, data)])
    assert result.error["kind"] == "runtime"
    assert result.error["message"].startswith("malformed tensor:")


def test_without_torch_tensors_are_read_only_numpy_arrays(start_worker, tmp_path):
    worker = start_worker(env=blocking_env(tmp_path / "blocked", "torch"))
    sha, data = blob(struct.pack("<3i", 1, 2, 3))
    result = worker.run(
        [
            tensor_upload("x", sha, "int32", [3]),
            module("m", DESCRIBE),
            function("describe", "m", "describe"),
            function("writable", "m", "writable"),
            call("d", "describe", ref("x")),
            call("w", "writable", ref("x")),
            give("d", "d"),
            give("w", "w"),
            give("x", "x"),
        ],
        [(sha, data)],
    )
    assert result.finished.status == "COMPLETED", result.error
    assert [n["value"] for n in result.value("d")["value"][:2]] == ["numpy", "int32"]
    assert result.value("w") == {"type": "boolean", "value": False}
    assert result.returns["x"][1] == [data]


def test_a_fresh_cpu_worker_imports_no_torch_until_a_tensor_appears(start_worker):
    worker = start_worker()
    source = "import sys\ndef loaded():\n    return 'torch' in sys.modules\n"
    program = [module("m", source), function("f", "m", "loaded"), call("t", "f"), give("t", "t")]
    assert worker.run(program).value("t") == {"type": "boolean", "value": False}
    sha, data = blob(struct.pack("<4f", 1, 2, 3, 4))
    tensor = {"op": "upload", "kind": "tensor", "id": "x", "dtype": "float32", "shape": [4]}
    worker.run([{**tensor, "blob": sha}], [(sha, data)])
    assert worker.run(program).value("t") == {"type": "boolean", "value": True}


def test_torch_global_settings_are_restored_between_programs(shared_worker):
    changer = (
        "import torch\ntorch.set_default_dtype(torch.float64)\ntorch.set_grad_enabled(False)\n"
    )
    probe = (
        "import torch\n"
        "def settings():\n"
        "    return [str(torch.get_default_dtype()), torch.is_grad_enabled()]\n"
    )
    assert shared_worker.run([module("c", changer)]).finished.status == "COMPLETED"
    result = shared_worker.run(
        [module("p", probe), function("f", "p", "settings"), call("s", "f"), give("s", "s")]
    )
    assert [n["value"] for n in result.value("s")["value"]] == ["torch.float32", True]


def test_a_torch_error_with_a_cpp_backtrace_is_reported_by_its_first_line() -> None:
    """torch's C++ errors can carry their whole backtrace after the first line (seen from a
    huge zero-size shape in the conformance audit): the instruction's message keeps the
    reason, not dozens of frames."""
    from types import SimpleNamespace

    from kcoral_server.worker.failures import InstructionFailure
    from kcoral_server.worker.runtime import torch_tensor

    def empty(shape: tuple[int, ...], dtype: object) -> None:
        raise RuntimeError(
            "Stride calculation overflowed\nException raised from empty_cpu at aten/x.cpp:1\n"
            "frame #0: c10::Error::Error(...) + 0x1 (0x0 in libc10.so)\n"
        )

    fake_torch = SimpleNamespace(float32="float32", empty=empty)
    with pytest.raises(InstructionFailure) as failed:
        torch_tensor(fake_torch, memoryview(b""), "float32", (0, 2**62, 4))
    assert failed.value.message == "malformed tensor: Stride calculation overflowed"
