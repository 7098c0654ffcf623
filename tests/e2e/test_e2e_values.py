"""Value returns of PROTOCOL §7.5 and tensors of §11 through the real client."""

from __future__ import annotations

import hashlib
import os

import ml_dtypes
import numpy as np
import pytest
from e2e_support import execute_program, module_program, sha256

import kcoral

IDENTITY = "def same(*values):\n    return values[0] if len(values) == 1 else list(values)\n"

DTYPES = {
    "bool": np.dtype(bool),
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "float16": np.dtype("<f2"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}


def sample(dtype: np.dtype, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    values = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 2
    if dtype == np.dtype(bool):
        return values > 0
    return values.astype(dtype)


def identity_program(values: dict[str, object]) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=IDENTITY, id="m")
    same = program.get_function(module=module, name="same", id="same")
    for name, value in values.items():
        uploaded = program.upload(kind="tensor", value=value, id=f"in_{name}")
        out = program.run(fn=same, args=[uploaded], id=f"out_{name}")
        program.return_(key=name, value=out)
    return program


def test_all_twelve_dtypes_round_trip_from_numpy_and_come_back_as_numpy_arrays(client):
    arrays = {name: sample(dtype) for name, dtype in DTYPES.items()}
    arrays["scalar"] = np.array(7.5, dtype=np.float32)
    arrays["empty"] = np.zeros((0, 4), dtype=np.int16)
    arrays["big_endian"] = np.arange(5, dtype=">i4")
    result = client.execute(identity_program(arrays))
    assert result.completed, result.error
    for name, sent in arrays.items():
        got = result[name]
        assert isinstance(got, np.ndarray) and got.flags.writeable and got.flags.owndata
        expected_dtype = sent.dtype.newbyteorder("<") if name == "big_endian" else sent.dtype
        assert got.dtype == expected_dtype, name
        assert got.shape == sent.shape
        assert got.tobytes() == sent.astype(expected_dtype).tobytes(), name


def test_all_twelve_dtypes_round_trip_from_torch_tensors(client):
    torch = pytest.importorskip("torch")
    tensors = {
        name: torch.from_numpy(sample(np.dtype(np.float32))).to(getattr(torch, name))
        if name != "bool"
        else torch.from_numpy(sample(np.dtype(bool)))
        for name in DTYPES
    }
    tensors["strided"] = torch.arange(12, dtype=torch.int32).reshape(3, 4).t()
    result = client.execute(identity_program(tensors))
    assert result.completed, result.error
    for name, sent in tensors.items():
        got = result[name]
        assert got.dtype == DTYPES.get(name, np.dtype("<i4"))
        assert got.shape == tuple(sent.shape)
        expected = sent.contiguous().view(torch.uint8).numpy().tobytes()
        assert got.tobytes() == expected, name


def test_numpy_scalars_encode_as_json_numbers_and_booleans(client, e2e_server):
    source = (
        "import numpy as np\n"
        "def scalars():\n"
        "    return [np.float32(2.5), np.int64(-3), np.bool_(True), np.uint8(200),\n"
        "            np.float64(0.125)]\n"
    )
    program = module_program(source, "scalars")
    assert client.execute(program)["out"] == [2.5, -3, True, 200, 0.125]
    raw = execute_program(e2e_server.url, program)
    assert raw.body["results"]["out"]["value"] == [
        {"type": "number", "value": 2.5},
        {"type": "integer", "value": -3},
        {"type": "boolean", "value": True},
        {"type": "integer", "value": 200},
        {"type": "number", "value": 0.125},
    ]


def test_dlpack_objects_and_numpy_arrays_made_on_the_server_return_as_tensors(client):
    source = (
        "import numpy as np\n"
        "class Capsule:\n"
        "    def __init__(self, array):\n"
        "        self.array = array\n"
        "    def __dlpack__(self, *args, **kwargs):\n"
        "        return self.array.__dlpack__(*args, **kwargs)\n"
        "    def __dlpack_device__(self):\n"
        "        return self.array.__dlpack_device__()\n"
        "def make():\n"
        "    return {'dl': Capsule(np.arange(6, dtype=np.float64).reshape(2, 3)),\n"
        "            'np': np.ones((2, 2), dtype=np.uint8)[:, ::-1]}\n"
    )
    out = client.execute(module_program(source, "make"))["out"]
    assert out["dl"].dtype == np.float64
    np.testing.assert_array_equal(out["dl"], np.arange(6, dtype=np.float64).reshape(2, 3))
    np.testing.assert_array_equal(out["np"], np.ones((2, 2), dtype=np.uint8))


def test_every_json_value_type_round_trips_through_literal_run_arguments(client, e2e_server):
    value = {
        "none": None,
        "t": True,
        "f": False,
        "int": -(2**62),
        "float": 1.5e-300,
        "str": "héllo ☃ \u0000 end",
        "list": [1, [2, [3, []]], {}],
        "tuple": (1, 2),
        "ref_shaped": {"$ref": "m"},
    }
    program = module_program(IDENTITY, "same", [value])
    got = client.execute(program)["out"]
    assert got == {**value, "tuple": [1, 2]}
    assert list(got) == list(value)  # insertion order kept
    node = execute_program(e2e_server.url, program).body["results"]["out"]
    assert node["type"] == "object"
    assert node["value"]["none"] == {"type": "null"}
    assert node["value"]["t"] == {"type": "boolean", "value": True}
    assert node["value"]["int"] == {"type": "integer", "value": -(2**62)}
    assert node["value"]["float"] == {"type": "number", "value": 1.5e-300}
    assert node["value"]["tuple"] == {
        "type": "array",
        "value": [{"type": "integer", "value": 1}, {"type": "integer", "value": 2}],
    }


def test_nested_binaries_are_numbered_depth_first_across_returns(client, e2e_server):
    source = (
        "import numpy as np\n"
        "def first():\n"
        "    return {'a': [b'p0', np.array([1, 2], dtype=np.int8)], 'b': bytearray(b'p2'),\n"
        "            'c': {'d': memoryview(b'p3'), 'e': 5}}\n"
        "def second():\n"
        "    return [b'p4', [[b'p5']]]\n"
    )
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    for name in ("first", "second"):
        fn = program.get_function(module=module, name=name, id=name)
        program.return_(key=name, value=program.run(fn=fn, id=f"{name}_out"))
    result = client.execute(program)
    assert result.completed, result.error
    assert result["first"]["a"][0] == b"p0"
    np.testing.assert_array_equal(result["first"]["a"][1], np.array([1, 2], dtype=np.int8))
    assert result["first"]["b"] == b"p2" and result["first"]["c"] == {"d": b"p3", "e": 5}
    assert result["second"] == [b"p4", [[b"p5"]]]

    raw = execute_program(e2e_server.url, program)
    assert raw.part_order == ["result"] + [f"return:{i}" for i in range(6)]
    first = raw.body["results"]["first"]["value"]
    assert first["a"]["value"][0]["part"] == "return:0"
    assert first["a"]["value"][1] == {
        "type": "tensor",
        "dtype": "int8",
        "shape": [2],
        "part": "return:1",
        "sha256": sha256(bytes([1, 2])),
    }
    assert first["b"]["part"] == "return:2" and first["c"]["value"]["d"]["part"] == "return:3"
    assert raw.parts["return:5"] == b"p5"


def module_fn(program: kcoral.Program, module: kcoral.Register) -> kcoral.Register:
    return program.get_function(module=module, name="one", id="one_fn")


@pytest.mark.parametrize(
    "expression",
    [
        "np.zeros(3, dtype=np.complex64)",
        "torch.zeros(3, dtype=torch.complex64)",
        "cycle()",
        "{1, 2}",
        "{'k': float('inf')}",
        "[1, object()]",
        "type",
        "[10**4300]",  # 4301 digits: FAILED kind engine, the worker's JSON refused it
        "{'k': -(10**4300)}",
    ],
)
def test_values_that_cannot_be_encoded_fail_the_return_with_serialization(client, expression):
    source = (
        "import numpy as np\n"
        "import torch\n"
        "def cycle():\n    a = []\n    a.append(a)\n    return a\n"
        "def one():\n    return 1\n"
        f"def make():\n    return {expression}\n"
    )
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    fn = program.get_function(module=module, name="make", id="make")
    program.return_(key="before", value=program.run(fn=module_fn(program, module), id="one"))
    program.return_(key="x", value=program.run(fn=fn, id="made"))
    result = client.execute(program)
    assert result.status == "FAILED"
    assert result.results == {"before": 1}
    assert result.error["instruction_index"] == 6
    assert result.error["kind"] == "serialization"
    assert result.error["instruction_op"] == "return" and result.error["instruction_id"] is None
    assert "x" not in result.results


def test_an_integer_of_4300_digits_comes_back_whole(client):
    program = kcoral.Program()
    module = program.upload(kind="module", source="def big():\n    return -(10**4300 - 1)\n")
    program.return_(key="v", value=program.run(fn=program.get_function(module=module, name="big")))
    result = client.execute(program)
    assert result.completed, result.error
    assert result["v"] == -(10**4300 - 1)


@pytest.mark.slow
def test_a_64_mib_bytes_value_round_trips_with_its_content_intact(client):
    data = os.urandom(64 * 1024 * 1024)
    program = kcoral.Program()
    module = program.upload(kind="module", source=IDENTITY, id="m")
    same = program.get_function(module=module, name="same", id="same")
    blob = program.upload(kind="bytes", value=data, id="blob")
    program.return_(key="back", value=program.run(fn=same, args=[blob], id="out"))
    result = client.execute(program)
    assert result.completed, result.error
    assert len(result["back"]) == len(data)
    assert hashlib.sha256(result["back"]).digest() == hashlib.sha256(data).digest()
